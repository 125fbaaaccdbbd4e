// GPT-2's layers on the CPU, forward and backward, templated on the element type: float is the
// training path, double the float64 reference the gradient checks use. Matrix products go
// through CBLAS; the rest are loops parallelised with OpenMP so that every output element is
// computed by one thread in a fixed order (bit-identical results for any thread count).
//
// Backward passes are split the way zero-bubble schedules need them: `...BackwardInput`
// produces the gradient flowing to the previous layer, `...BackwardWeight` accumulates
// parameter gradients from the same stashed output gradient, and the two may run at
// different times. Weight gradients always accumulate (+=); input gradients overwrite unless
// stated.
//
// Shapes: N rows (= batch × time), C channels, OC output channels; matrices row-major as in
// llm.c (a weight is [OC, C], out = inp · Wᵀ + b).
#pragma once

#include <cstdint>

namespace freeride::cpu {

// C = alpha · op(A) · op(B) + beta · C, row-major.
template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

template <typename T>
void EncoderForward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t B,
                    int64_t Tlen, int64_t C);
template <typename T>
void EncoderBackwardWeight(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t B,
                           int64_t Tlen, int64_t C);

template <typename T>
void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                      int64_t N, int64_t C);
// dinp += gradient through the normalisation (accumulates: LayerNorm sits on a residual branch).
template <typename T>
void LayerNormBackwardInput(T* dinp, const T* dout, const T* inp, const T* weight,
                            const T* mean, const T* rstd, int64_t N, int64_t C);
template <typename T>
void LayerNormBackwardWeight(T* dweight, T* dbias, const T* dout, const T* inp, const T* mean,
                             const T* rstd, int64_t N, int64_t C);

// out = inp · wᵀ (+ bias when not null).
template <typename T>
void MatmulForward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C,
                   int64_t OC);
// dinp = dout · w.
template <typename T>
void MatmulBackwardInput(T* dinp, const T* dout, const T* weight, int64_t N, int64_t C,
                         int64_t OC);
// dweight += doutᵀ · inp; dbias += column sums of dout (when dbias is not null).
template <typename T>
void MatmulBackwardWeight(T* dweight, T* dbias, const T* dout, const T* inp, int64_t N,
                          int64_t C, int64_t OC);

// Causal multi-head self-attention. qkv is [B, T, 3C] (q, k, v side by side, heads inside
// each), out is [B, T, C], att keeps the softmax probabilities [B, NH, T, T] for backward.
// attention.h's grouped-query attention with NKV = NH, hs = C / NH.
template <typename T>
void AttentionForward(T* out, T* att, const T* qkv, int64_t B, int64_t Tlen, int64_t C,
                      int64_t NH);
// dqkv = gradient of the attention inputs (overwritten).
template <typename T>
void AttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* att, int64_t B,
                       int64_t Tlen, int64_t C, int64_t NH);

// GELU with the tanh approximation GPT-2 uses.
template <typename T>
void GeluForward(T* out, const T* inp, int64_t N);
template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, int64_t N);

template <typename T>
void ResidualForward(T* out, const T* a, const T* b, int64_t N);
// a += b.
template <typename T>
void AddInPlace(T* a, const T* b, int64_t N);

// Softmax cross-entropy over the first V of Vp logits per row (padded logits never enter the
// softmax). Writes each row's loss and its log-sum-exp (kept for backward).
template <typename T>
void CrossEntropyForward(T* losses, T* logsumexp, const T* logits, const int32_t* targets,
                         int64_t N, int64_t V, int64_t Vp);
// dlogits = scale · (softmax − onehot(target)); the padded columns get 0.
template <typename T>
void CrossEntropyBackward(T* dlogits, const T* logits, const T* logsumexp,
                          const int32_t* targets, T scale, int64_t N, int64_t V, int64_t Vp);

}  // namespace freeride::cpu
