// Causal attention in bf16 without the T × T matrices (the "flash" algorithm): tiles of
// queries and keys in shared memory, products on tensor cores (WMMA, bf16 in, fp32 out), an
// online softmax in fp32, and a backward that recomputes the probabilities from each row's
// log-sum-exp. Q, K, V are read by strides straight from the qkv projection's output, rows
// [q (NH·hs), k (NKV·hs), v (NKV·hs)] (grouped-query attention: query head h reads key/value
// head h / (NH / NKV); GPT-2's [B, T, 3, NH, hs] is NKV = NH), and the result written as
// [B, T, NH·hs], so no head reshuffle runs. The arithmetic of each tile is flash_tile.h's,
// which the CPU tests hold to float64 attention.
//
// Deterministic: no atomics; dK and dV are summed over query tiles by the block that owns the
// key tile (one per query head: grouped-query attention's are then summed over each group, in
// head order), dQ over key tiles by the block that owns the query tile, each in a fixed order.
// Shapes: flash::ShapeSupported (the caller runs the reference path otherwise).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace freeride::cuda {

// out [B, T, NH·hs] = softmax(q·kᵀ/√hs, causal)·v per head; lse [B·NH·T] (fp32, row
// (b·NH + h)·T + t) the log-sum-exp of each row's scaled scores, for backward.
void FlashAttentionForward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int64_t B,
                           int64_t T, int64_t NH, int64_t NKV, int64_t hs, cudaStream_t stream);

// dqkv (overwritten; qkv's layout) from dout [B, T, NH·hs] and the forward's qkv, out and lse.
// `rowsum` [B·NH·T] fp32 is scratch for D = Σ dout ∘ out per row; `heads` [B, T, 2, NH, hs] is
// scratch for each query head's dK and dV where NKV < NH (else unused: null).
void FlashAttentionBackward(__nv_bfloat16* dqkv, float* rowsum, __nv_bfloat16* heads,
                            const __nv_bfloat16* dout, const __nv_bfloat16* qkv,
                            const __nv_bfloat16* out, const float* lse, int64_t B, int64_t T,
                            int64_t NH, int64_t NKV, int64_t hs, cudaStream_t stream);

}  // namespace freeride::cuda
