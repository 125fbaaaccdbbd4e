#include "models/cpu/optimizer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "models/cpu/parallel.h"

namespace freeride::cpu {

template <typename T>
void AdamWUpdate(T* param, const T* grad, T* m, T* v, int64_t n, const AdamWParams& p) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(p.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(p.step));
  const T b1 = static_cast<T>(p.beta1), b2 = static_cast<T>(p.beta2);
  const T eps = static_cast<T>(p.eps), decay = static_cast<T>(1.0 - p.lr * p.weight_decay);
  const T step_size = static_cast<T>(p.lr / bc1), bc2_sqrt = static_cast<T>(std::sqrt(bc2));
  const T scale = static_cast<T>(p.grad_scale);
#pragma omp parallel for schedule(static) if (ParallelWorth(n))
  for (int64_t i = 0; i < n; ++i) {
    const T g = grad[i] * scale;
    m[i] = b1 * m[i] + (1 - b1) * g;
    v[i] = b2 * v[i] + (1 - b2) * g * g;
    param[i] *= decay;
    param[i] -= step_size * m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps);
  }
}

template <typename T>
void ChunkSquares(const T* x, int64_t n, double* partials) {
  const int64_t chunks = (n + kSquaresChunk - 1) / kSquaresChunk;
#pragma omp parallel for schedule(static) if (ParallelWorth(n))
  for (int64_t c = 0; c < chunks; ++c) {
    // Eight interleaved accumulators (a fixed order, so still deterministic) let the compiler
    // keep the loop in vector registers.
    constexpr int kLanes = 8;
    double lane[kLanes] = {};
    const int64_t lo = c * kSquaresChunk, hi = std::min(n, lo + kSquaresChunk);
    int64_t i = lo;
    for (; i + kLanes <= hi; i += kLanes) {
      for (int k = 0; k < kLanes; ++k) {
        lane[k] += static_cast<double>(x[i + k]) * static_cast<double>(x[i + k]);
      }
    }
    double s = 0;
    for (; i < hi; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    for (int k = 0; k < kLanes; ++k) s += lane[k];
    partials[c] = s;
  }
}

template <typename T>
double SumOfSquares(const T* x, int64_t n) {
  std::vector<double> partial(static_cast<size_t>((n + kSquaresChunk - 1) / kSquaresChunk), 0.0);
  ChunkSquares(x, n, partial.data());
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

template void AdamWUpdate<float>(float*, const float*, float*, float*, int64_t,
                                 const AdamWParams&);
template void AdamWUpdate<double>(double*, const double*, double*, double*, int64_t,
                                  const AdamWParams&);
template double SumOfSquares<float>(const float*, int64_t);
template double SumOfSquares<double>(const double*, int64_t);
template void ChunkSquares<float>(const float*, int64_t, double*);
template void ChunkSquares<double>(const double*, int64_t, double*);

}  // namespace freeride::cpu
