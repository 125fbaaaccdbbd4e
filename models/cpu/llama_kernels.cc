#include "models/cpu/llama_kernels.h"

#include <algorithm>
#include <cmath>

#include "models/cpu/parallel.h"
#include "models/cpu/vec_math.h"

namespace freeride::cpu {

template <typename T>
void EmbeddingForward(T* out, const int32_t* tokens, const T* wte, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (ParallelWorth(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const T* te = wte + static_cast<int64_t>(tokens[n]) * C;
    std::copy(te, te + C, out + n * C);
  }
}

template <typename T>
void EmbeddingBackwardWeight(T* dwte, const T* dout, const int32_t* tokens, int64_t N, int64_t C) {
  // A token may repeat inside the batch, so rows are visited in order (deterministic).
  for (int64_t n = 0; n < N; ++n) {
    const T* d = dout + n * C;
    T* te = dwte + static_cast<int64_t>(tokens[n]) * C;
    for (int64_t i = 0; i < C; ++i) te[i] += d[i];
  }
}

template <typename T>
void RMSNormForward(T* out, T* rstd, const T* inp, const T* weight, T eps, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (ParallelWorth(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    T ms = 0;
    for (int64_t i = 0; i < C; ++i) ms += x[i] * x[i];
    ms /= static_cast<T>(C);
    const T s = static_cast<T>(1) / std::sqrt(ms + eps);
    T* o = out + n * C;
    for (int64_t i = 0; i < C; ++i) o[i] = x[i] * s * weight[i];
    rstd[n] = s;
  }
}

template <typename T>
void RMSNormBackwardInput(T* dinp, const T* dout, const T* inp, const T* weight, const T* rstd,
                          int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (ParallelWorth(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const T* d = dout + n * C;
    const T* x = inp + n * C;
    const T s = rstd[n];
    // d(x·s)/dx = s·(I − s²·x·xᵀ/C): project out the part along x.
    T dot = 0;
    for (int64_t i = 0; i < C; ++i) dot += weight[i] * d[i] * x[i];
    const T k = dot * s * s / static_cast<T>(C);
    T* di = dinp + n * C;
    for (int64_t i = 0; i < C; ++i) di[i] += (weight[i] * d[i] - k * x[i]) * s;
  }
}

template <typename T>
void RMSNormBackwardWeight(T* dweight, const T* dout, const T* inp, const T* rstd, int64_t N,
                           int64_t C) {
  ForEachColumnBlock(C, N * C, [&](int64_t lo, int64_t hi) {
    for (int64_t n = 0; n < N; ++n) {
      const T* d = dout + n * C;
      const T* x = inp + n * C;
      const T s = rstd[n];
      for (int64_t i = lo; i < hi; ++i) dweight[i] += x[i] * s * d[i];
    }
  });
}

template <typename T>
void RopeTables(std::vector<T>* cos, std::vector<T>* sin, int64_t Tlen, int64_t hs, double theta) {
  const int64_t half = hs / 2;
  cos->resize(static_cast<size_t>(Tlen * half));
  sin->resize(static_cast<size_t>(Tlen * half));
  for (int64_t t = 0; t < Tlen; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(hs));
      const double angle = static_cast<double>(t) * freq;
      (*cos)[t * half + i] = static_cast<T>(std::cos(angle));
      (*sin)[t * half + i] = static_cast<T>(std::sin(angle));
    }
  }
}

template <typename T>
void RopeInPlace(T* x, const T* cos, const T* sin, int64_t B, int64_t Tlen, int64_t heads,
                 int64_t hs, int64_t stride, bool inverse) {
  const int64_t half = hs / 2;
#pragma omp parallel for schedule(static) if (ParallelWorth(B * Tlen * heads * hs))
  for (int64_t bt = 0; bt < B * Tlen; ++bt) {
    const int64_t t = bt % Tlen;
    const T* c = cos + t * half;
    const T* s = sin + t * half;
    for (int64_t h = 0; h < heads; ++h) {
      T* v = x + bt * stride + h * hs;
      for (int64_t i = 0; i < half; ++i) {
        const T x1 = v[i], x2 = v[i + half];
        const T sn = inverse ? -s[i] : s[i];
        v[i] = x1 * c[i] - x2 * sn;
        v[i + half] = x2 * c[i] + x1 * sn;
      }
    }
  }
}

namespace {
template <typename T>
inline T Sigmoid(T x) {
  return static_cast<T>(1) / (static_cast<T>(1) + VecExp(-x));
}
}  // namespace

template <typename T>
void SwiGluForward(T* out, const T* h, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static) if (ParallelWorth(N * F))
  for (int64_t n = 0; n < N; ++n) {
    const T* gate = h + n * 2 * F;
    const T* up = gate + F;
    T* o = out + n * F;
    for (int64_t i = 0; i < F; ++i) o[i] = gate[i] * Sigmoid(gate[i]) * up[i];
  }
}

template <typename T>
void SwiGluBackward(T* dh, const T* h, const T* dout, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static) if (ParallelWorth(N * F))
  for (int64_t n = 0; n < N; ++n) {
    const T* gate = h + n * 2 * F;
    const T* up = gate + F;
    const T* d = dout + n * F;
    T* dgate = dh + n * 2 * F;
    T* dup = dgate + F;
    for (int64_t i = 0; i < F; ++i) {
      const T x = gate[i], s = Sigmoid(x);
      dup[i] = d[i] * x * s;
      // silu'(x) = s · (1 + x · (1 − s)).
      dgate[i] = d[i] * up[i] * s * (1 + x * (1 - s));
    }
  }
}

#define FR_INSTANTIATE_LLAMA_KERNELS(T)                                                       \
  template void EmbeddingForward<T>(T*, const int32_t*, const T*, int64_t, int64_t);          \
  template void EmbeddingBackwardWeight<T>(T*, const T*, const int32_t*, int64_t, int64_t);   \
  template void RMSNormForward<T>(T*, T*, const T*, const T*, T, int64_t, int64_t);           \
  template void RMSNormBackwardInput<T>(T*, const T*, const T*, const T*, const T*, int64_t,  \
                                        int64_t);                                             \
  template void RMSNormBackwardWeight<T>(T*, const T*, const T*, const T*, int64_t, int64_t); \
  template void RopeTables<T>(std::vector<T>*, std::vector<T>*, int64_t, int64_t, double);    \
  template void RopeInPlace<T>(T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t,    \
                               int64_t, bool);                                                \
  template void SwiGluForward<T>(T*, const T*, int64_t, int64_t);                             \
  template void SwiGluBackward<T>(T*, const T*, const T*, int64_t, int64_t);

FR_INSTANTIATE_LLAMA_KERNELS(float)
FR_INSTANTIATE_LLAMA_KERNELS(double)
#undef FR_INSTANTIATE_LLAMA_KERNELS

}  // namespace freeride::cpu
