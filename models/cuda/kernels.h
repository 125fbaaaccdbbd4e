// GPT-2's layers on CUDA, forward and backward: the device counterpart of models/cpu/kernels.h,
// with the same shapes and the same split of each backward into its input and weight halves.
// Elements `T` are float or __nv_bfloat16 (weights and activations); every reduction accumulates
// in fp32 (fp64 for the gradient norm), parameter gradients are always fp32, and no kernel uses
// atomics: the same inputs give the same bits.
//
// Every function enqueues on `stream` and returns at once; CudaStage checks each launch after
// it (and, with FREERIDE_CUDA_CHECK_LAUNCHES=1, synchronises). Matrix products live in matmul.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace freeride::cuda {

using bf16 = __nv_bfloat16;

// out[b,t,:] = wte[token[b,t],:] + wpe[t,:] (+ nothing without wpe: Llama's positions are
// rotary).
template <typename T>
void EncoderForward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t B,
                    int64_t Tlen, int64_t C, cudaStream_t stream);
// dwte[v,:] += Σ dout over the positions holding token v, in `positions` order (positions
// sorted by token: `starts[u]..starts[u+1]` hold token `tokens[u]`, `distinct` tokens);
// dwpe[t,:] += Σ_b dout[b,t,:] where dwpe is not null.
template <typename T>
void EncoderBackwardWeight(float* dwte, float* dwpe, const T* dout, const int32_t* positions,
                           const int32_t* tokens, const int32_t* starts, int64_t distinct,
                           int64_t B, int64_t Tlen, int64_t C, cudaStream_t stream);

// One warp per row; mean and rstd kept in fp32 for backward.
template <typename T>
void LayerNormForward(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                      const T* bias, int64_t N, int64_t C, cudaStream_t stream);
// dinp += gradient through the normalisation.
template <typename T>
void LayerNormBackwardInput(T* dinp, const T* dout, const T* inp, const T* weight,
                            const float* mean, const float* rstd, int64_t N, int64_t C,
                            cudaStream_t stream);
// dweight += Σ_rows dout·x̂, dbias += Σ_rows dout; `partials` holds 2·kColumnChunks·C floats.
template <typename T>
void LayerNormBackwardWeight(float* dweight, float* dbias, const T* dout, const T* inp,
                             const float* mean, const float* rstd, int64_t N, int64_t C,
                             float* partials, cudaStream_t stream);

// dbias += column sums of dout [N, OC]; `partials` holds kColumnChunks·OC floats.
template <typename T>
void BiasBackward(float* dbias, const T* dout, int64_t N, int64_t OC, float* partials,
                  cudaStream_t stream);

template <typename T>
void GeluForward(T* out, const T* inp, int64_t n, cudaStream_t stream);
template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, int64_t n, cudaStream_t stream);

template <typename T>
void ResidualForward(T* out, const T* a, const T* b, int64_t n, cudaStream_t stream);
template <typename T>
void Copy(T* dst, const T* src, int64_t n, cudaStream_t stream);
// dst += src (fp32).
void AddInPlace(float* dst, const float* src, int64_t n, cudaStream_t stream);

template <typename To, typename From>
void Convert(To* dst, const From* src, int64_t n, cudaStream_t stream);

// Attention without a fused library kernel: qkv [B, T, 3C] → q, k, v [B, NH, T, hs] (each
// `B·T·C` apart in `qkv_heads`), and back for the output and the gradients.
template <typename T>
void SplitHeads(T* qkv_heads, const T* qkv, int64_t B, int64_t Tlen, int64_t C, int64_t NH,
                cudaStream_t stream);
template <typename T>
void MergeHeadsGrad(T* dqkv, const T* dqkv_heads, int64_t B, int64_t Tlen, int64_t C, int64_t NH,
                    cudaStream_t stream);
// y [B, NH, T, hs] → out [B, T, C] and its inverse for the gradient.
template <typename T>
void MergeHeads(T* out, const T* y, int64_t B, int64_t Tlen, int64_t C, int64_t NH,
                cudaStream_t stream);
template <typename T>
void SplitHeadsGrad(T* dy, const T* dout, int64_t B, int64_t Tlen, int64_t C, int64_t NH,
                    cudaStream_t stream);
// In place over scores [rows of T]: causal softmax of scale·score (row t sees 0..t; the rest
// become 0), each row's log-sum-exp of scale·score kept in `lse`. `rows` = B·NH·T.
template <typename T>
void CausalSoftmaxForward(T* att, float* lse, float scale, int64_t rows, int64_t Tlen,
                          cudaStream_t stream);
// In place over the same scores recomputed: the probabilities again, exp(scale·score − lse),
// so that no layer keeps its T × T probabilities from forward to backward.
template <typename T>
void CausalSoftmaxRecompute(T* att, const float* lse, float scale, int64_t rows, int64_t Tlen,
                            cudaStream_t stream);
// datt → gradient of the scores (before scaling, times `scale`), in place.
template <typename T>
void CausalSoftmaxBackward(T* datt, const T* att, float scale, int64_t rows, int64_t Tlen,
                           cudaStream_t stream);

// Per row: loss = logsumexp(logits[:V]) − logits[target]; the padded columns never enter.
template <typename T>
void CrossEntropyForward(float* losses, float* logsumexp, const T* logits,
                         const int32_t* targets, int64_t N, int64_t V, int64_t Vp,
                         cudaStream_t stream);
// In place: logits → scale·(softmax − onehot(target)), padded columns 0. The probabilities
// are never stored.
template <typename T>
void CrossEntropyBackward(T* logits, const float* logsumexp, const int32_t* targets,
                          float scale, int64_t N, int64_t V, int64_t Vp, cudaStream_t stream);

// out[0] = Σ x (fp64, fixed order); `partials` holds kReduceBlocks doubles.
void Sum(double* out, const float* x, int64_t n, double* partials, cudaStream_t stream);
// out[0] (+)= Σ x² (fp64, fixed order); accumulate adds to out[0] instead of overwriting.
void SumOfSquares(double* out, const float* x, int64_t n, bool accumulate, double* partials,
                  cudaStream_t stream);

struct AdamWArgs {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
  float bias_correction1, bias_correction2;  // 1 − β^step
};
// PyTorch's AdamW on fp32 master weights; `compute` (bf16 or null) gets the rounded copy.
void AdamW(float* master, bf16* compute, const float* grad, float* m, float* v, int64_t n,
           const AdamWArgs& args, cudaStream_t stream);

}  // namespace freeride::cuda
