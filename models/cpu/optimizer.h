// The optimizer's arithmetic on the CPU: AdamW over one tensor, and sums of squares for the
// global gradient norm.
#pragma once

#include <cstdint>

namespace freeride::cpu {

struct AdamWParams {
  float lr = 0;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0;  // already 0 for tensors that are not decayed
  int64_t step = 1;        // 1-based, for the bias corrections
  float grad_scale = 1;    // multiplies every gradient first (gradient clipping)
};

// PyTorch's AdamW: m, v moments; decoupled decay param -= lr·wd·param; bias-corrected update.
template <typename T>
void AdamWUpdate(T* param, const T* grad, T* m, T* v, int64_t n, const AdamWParams& p);

// SumOfSquares's chunk: Σ x² is made per chunk of this many elements from x's start, then the
// chunks' sums are added in order. The chunks are the gradient norm's atoms
// (models/grad_norm.h): ZeRO-1 ranks each make the sums of the chunks they hold.
inline constexpr int64_t kSquaresChunk = int64_t{1} << 16;

// Σ x² in double, summed over fixed-size chunks in order: the same bits for any thread count.
template <typename T>
double SumOfSquares(const T* x, int64_t n);

// Σ x² of each kSquaresChunk-chunk of x[0, n), into partials[0, ceil(n / kSquaresChunk)):
// SumOfSquares is 0 plus these in order.
template <typename T>
void ChunkSquares(const T* x, int64_t n, double* partials);

}  // namespace freeride::cpu
