// The Llama family's layers on CUDA, forward and backward: the device counterpart of
// models/cpu/llama_kernels.h, with the same shapes and the same split of each backward into its
// input and weight halves (the matrix products are matmul.h's, the embedding, residuals,
// cross-entropy and the attention's softmax kernels.h's). As in kernels.h: T is float or
// __nv_bfloat16, every reduction accumulates in fp32, parameter gradients are fp32, and no
// kernel uses atomics.
//
// Shapes: N rows (= batch × time), C channels. qkv rows are [q (NH·hs), k (NKV·hs), v (NKV·hs)]:
// grouped-query attention, query head h reads key/value head h / (NH / NKV).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace freeride::cuda {

// out = x · rstd · weight with rstd = 1 / sqrt(mean(x²) + eps) kept in fp32 per row.
template <typename T>
void RMSNormForward(T* out, float* rstd, const T* inp, const T* weight, float eps, int64_t N,
                    int64_t C, cudaStream_t stream);
// dinp += the gradient through the normalisation (it sits on a residual branch).
template <typename T>
void RMSNormBackwardInput(T* dinp, const T* dout, const T* inp, const T* weight, const float* rstd,
                          int64_t N, int64_t C, cudaStream_t stream);
// dweight += Σ_rows dout · x · rstd; `partials` holds kColumnChunks·C floats.
template <typename T>
void RMSNormBackwardWeight(float* dweight, const T* dout, const T* inp, const float* rstd,
                           int64_t N, int64_t C, float* partials, cudaStream_t stream);

// Rotates the first `heads` heads of each of the B·Tlen rows of `x` (row stride `stride`) in
// place, Hugging Face's layout (element i pairs with i + hs/2), by the fp32 tables cos and sin
// [Tlen, hs/2]; `inverse` rotates back (the backward of a rotation). q and k are adjacent at
// the start of a qkv row, so one call with heads = NH + NKV covers both.
template <typename T>
void RopeInPlace(T* x, const float* cos, const float* sin, int64_t B, int64_t Tlen, int64_t heads,
                 int64_t hs, int64_t stride, bool inverse, cudaStream_t stream);

// h [N, 2F] (gate columns, then up) → out [N, F] = silu(gate) · up.
template <typename T>
void SwiGluForward(T* out, const T* h, int64_t N, int64_t F, cudaStream_t stream);
// dh [N, 2F] (overwritten) from dout [N, F].
template <typename T>
void SwiGluBackward(T* dh, const T* h, const T* dout, int64_t N, int64_t F, cudaStream_t stream);

// Grouped-query attention on the reference path: qkv [B, T, (NH + 2·NKV)·hs] → q, k, v each
// [B, NH, T, hs] (`B·NH·T·hs` apart in `heads`), each query head's key/value head copied out to
// it, so that the batched products and softmax kernels of GPT-2's attention run unchanged.
template <typename T>
void GqaSplitHeads(T* heads, const T* qkv, int64_t B, int64_t Tlen, int64_t NH, int64_t NKV,
                   int64_t hs, cudaStream_t stream);
// Its backward: dqkv [B, T, (NH + 2·NKV)·hs] (overwritten) from dq, dk, dv [B, NH, T, hs]; a
// key/value head's gradient is the sum over its group's query heads, in head order.
template <typename T>
void GqaMergeHeadsGrad(T* dqkv, const T* dheads, int64_t B, int64_t Tlen, int64_t NH, int64_t NKV,
                       int64_t hs, cudaStream_t stream);

}  // namespace freeride::cuda
