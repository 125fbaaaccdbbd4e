// The Llama family's layers on the CPU (the matrix products, residuals and cross-entropy are
// GPT-2's, in kernels.h), forward and backward, templated on the element type as kernels.h is,
// with the same rules: every output element computed by one thread in a fixed order, weight
// gradients accumulate (+=), input gradients overwrite unless stated.
//
// Shapes: N rows (= batch × time), C channels. Grouped-query attention
// (GqaAttentionForward/Backward) is attention.h's, which GPT-2 shares.
#pragma once

#include <cstdint>
#include <vector>

#include "models/cpu/attention.h"

namespace freeride::cpu {

// out = wte[token] for each of the N tokens (no position table: positions are rotary).
template <typename T>
void EmbeddingForward(T* out, const int32_t* tokens, const T* wte, int64_t N, int64_t C);
template <typename T>
void EmbeddingBackwardWeight(T* dwte, const T* dout, const int32_t* tokens, int64_t N, int64_t C);

// out = x / sqrt(mean(x²) + eps) · weight; rstd keeps 1 / sqrt(mean(x²) + eps) per row.
template <typename T>
void RMSNormForward(T* out, T* rstd, const T* inp, const T* weight, T eps, int64_t N, int64_t C);
// dinp += gradient through the normalisation (accumulates: it sits on a residual branch).
template <typename T>
void RMSNormBackwardInput(T* dinp, const T* dout, const T* inp, const T* weight, const T* rstd,
                          int64_t N, int64_t C);
template <typename T>
void RMSNormBackwardWeight(T* dweight, const T* dout, const T* inp, const T* rstd, int64_t N,
                           int64_t C);

// The rotary tables for positions [0, Tlen) and head size hs: cos and sin [Tlen, hs/2] of
// t · theta^(-2i/hs), computed in double.
template <typename T>
void RopeTables(std::vector<T>* cos, std::vector<T>* sin, int64_t Tlen, int64_t hs, double theta);
// Rotates the `heads` heads at the start of each of the B·Tlen rows of `x` (row stride
// `stride`) in place, in Hugging Face's layout: element i pairs with i + hs/2. `inverse`
// rotates back (the backward of a rotation is its inverse).
template <typename T>
void RopeInPlace(T* x, const T* cos, const T* sin, int64_t B, int64_t Tlen, int64_t heads,
                 int64_t hs, int64_t stride, bool inverse);

// SwiGLU: h is [N, 2F] (gate columns then up columns); out [N, F] = silu(gate) · up.
template <typename T>
void SwiGluForward(T* out, const T* h, int64_t N, int64_t F);
// dh [N, 2F] (overwritten) from dout [N, F].
template <typename T>
void SwiGluBackward(T* dh, const T* h, const T* dout, int64_t N, int64_t F);

}  // namespace freeride::cpu
