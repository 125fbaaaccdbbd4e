// The arithmetic of the fused classifier (classifier.cu), apart from the kernel so that the CPU
// tests run the very same functions over real rows against float64 log-softmax: the online
// softmax (a running max and a sum rescaled when the max grows), the merge of two partial
// states (what the warp shuffles and the block's shared memory do), each row's loss and
// log-sum-exp, the logits gradient scale·(softmax − onehot), and the launch geometry (one
// block per row, 128-bit vectors of the row).
//
// Conventions: a row holds Vp logits of which the first V are real; the padded columns never
// enter the softmax and get a gradient of 0.
#pragma once

#include <cmath>
#include <cstdint>

#include "models/cuda/attention_layout.h"  // FR_HOST_DEVICE

namespace freeride::cuda::classifier {

// Threads per block (one block per row): GPT-2's 50304 columns are 6288 bf16 vectors of 8,
// about 12 per thread.
inline constexpr int kThreads = 512;
inline constexpr int kVectorBytes = 16;

// Elements per 128-bit vector for `element_bytes` (2: bf16, 4: fp32).
FR_HOST_DEVICE constexpr int64_t VectorWidth(int64_t element_bytes) {
  return kVectorBytes / element_bytes;
}

// The fused kernel reads whole vectors of every row: each row must start 16-byte aligned (the
// planned logits buffer is 256-aligned), so Vp must be a multiple of the vector width. Rows
// in gridDim.x (at most 2^31 − 1), column indices in 32 bits.
FR_HOST_DEVICE constexpr bool ShapeSupported(int64_t N, int64_t Vp, int64_t element_bytes) {
  return N >= 1 && N <= 0x7fffffff && Vp >= 1 && Vp <= 0x7fffffff &&
         Vp % VectorWidth(element_bytes) == 0;
}

// a·b rounded once: no fused multiply-add, so that Merge gives the same bits whichever state
// comes first (every lane of a shuffle tree then holds the same result).
FR_HOST_DEVICE inline float MulRounded(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// Σ exp(x − max) over the columns seen so far; max = −∞ and sum = 0 before any.
struct OnlineSoftmax {
  float max = -INFINITY;
  float sum = 0.0f;
};

// Taking in columns whose largest is `x_max`: the new max (NewMax), the old sum rescaled to
// it (Rescaled), then the caller adds exp(x − new max) of each new column.
FR_HOST_DEVICE inline float NewMax(const OnlineSoftmax& s, float x_max) {
  return fmaxf(s.max, x_max);
}
// `new_max` is finite (a state that has seen nothing has sum 0, and 0·exp(−∞) is 0).
FR_HOST_DEVICE inline OnlineSoftmax Rescaled(const OnlineSoftmax& s, float new_max) {
  return {new_max, MulRounded(s.sum, expf(s.max - new_max))};
}

// Two partial states of the same row, each over its own columns: the state over both.
// Symmetric in a and b to the bit.
FR_HOST_DEVICE inline OnlineSoftmax Merge(const OnlineSoftmax& a, const OnlineSoftmax& b) {
  const float m = fmaxf(a.max, b.max);
  if (m == -INFINITY) return {};  // both empty: exp(−∞ − −∞) would be NaN
  return {m, Rescaled(a, m).sum + Rescaled(b, m).sum};
}

// One thread's share of a row: vectors thread, thread + threads, …; `load(vector, values)`
// gives the vector's `W` columns as floats. Columns ≥ V are skipped.
template <int W, typename Load>
FR_HOST_DEVICE inline OnlineSoftmax ThreadShare(Load load, int thread, int threads, int V, int Vp) {
  OnlineSoftmax s;
  for (int vec = thread; vec * W < Vp; vec += threads) {
    float x[W];
    load(vec, x);
    const int first = vec * W;
    float x_max = -INFINITY;
    for (int k = 0; k < W; ++k) {
      if (first + k < V) x_max = fmaxf(x_max, x[k]);
    }
    if (x_max == -INFINITY) continue;  // all padding
    s = Rescaled(s, NewMax(s, x_max));
    for (int k = 0; k < W; ++k) {
      if (first + k < V) s.sum += expf(x[k] - s.max);
    }
  }
  return s;
}

FR_HOST_DEVICE inline float LogSumExp(const OnlineSoftmax& s) { return s.max + logf(s.sum); }

// The row's loss: −log softmax(x)[target].
FR_HOST_DEVICE inline float Loss(float lse, float x_target) { return lse - x_target; }

// d loss·scale / d x at column `v` (x its logit), as CrossEntropyBackward computes it.
FR_HOST_DEVICE inline float Gradient(float x, float lse, bool is_target, bool is_padding,
                                     float scale) {
  if (is_padding) return 0.0f;
  const float p = expf(x - lse);
  return scale * (p - (is_target ? 1.0f : 0.0f));
}

}  // namespace freeride::cuda::classifier
