#include "models/cpu/kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "models/cpu/attention.h"
#include "models/cpu/parallel.h"
#include "models/cpu/vec_math.h"

namespace freeride::cpu {
namespace {

inline CBLAS_TRANSPOSE Op(bool trans) { return trans ? CblasTrans : CblasNoTrans; }

void BlasGemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
              const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, Op(ta), Op(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void BlasGemm(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda,
              const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, Op(ta), Op(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// OpenBLAS's threaded GEMM gives different bits for different thread counts (its split of the
// output changes which elements its edge kernels compute). So the output is cut here into
// blocks of a fixed size along its longer side, whatever the thread count, and each block is
// one BLAS call on one thread (OpenBLAS's OpenMP build runs single-threaded inside a parallel
// region; with one thread the trainer sets OpenBLAS to one thread too): the same bits for
// any number of threads, at 1-12% (about 7%) more time than OpenBLAS's own split on GPT-2
// 124M's products (bench/results/2026-11-23-cpu-gemm-fixed-blocks.log).
template <typename T>
void FixedBlockGemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                    int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  // Blocks of 256 on large products; small ones are cut into about 16 (at least 32 wide) so
  // that they still spread over the threads. The block depends on the shape only.
  const bool split_rows = M >= N;
  const int64_t longer = split_rows ? M : N;
  const int64_t kBlock = std::clamp<int64_t>((longer / 16 + 15) / 16 * 16, 32, 256);
  const int64_t blocks = (longer + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (ParallelWorth(M * N * K))
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t lo = blk * kBlock;
    const int64_t m0 = split_rows ? lo : 0, n0 = split_rows ? 0 : lo;
    const int64_t rows = split_rows ? std::min(kBlock, M - lo) : M;
    const int64_t cols = split_rows ? N : std::min(kBlock, N - lo);
    const T* a = ta ? A + m0 : A + m0 * lda;
    const T* b = tb ? B + n0 * ldb : B + n0;
    BlasGemm(ta, tb, static_cast<int>(rows), static_cast<int>(cols), static_cast<int>(K), alpha,
             a, static_cast<int>(lda), b, static_cast<int>(ldb), beta, C + m0 * ldc + n0,
             static_cast<int>(ldc));
  }
}

}  // namespace

template <>
void Gemm<float>(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  FixedBlockGemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <>
void Gemm<double>(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                  const double* A, int64_t lda, const double* B, int64_t ldb, double beta,
                  double* C, int64_t ldc) {
  FixedBlockGemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <typename T>
void EncoderForward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t B,
                    int64_t Tlen, int64_t C) {
#pragma omp parallel for schedule(static) if (ParallelWorth(B * Tlen * C))
  for (int64_t bt = 0; bt < B * Tlen; ++bt) {
    const T* te = wte + static_cast<int64_t>(tokens[bt]) * C;
    const T* pe = wpe + (bt % Tlen) * C;
    T* o = out + bt * C;
    for (int64_t i = 0; i < C; ++i) o[i] = te[i] + pe[i];
  }
}

template <typename T>
void EncoderBackwardWeight(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t B,
                           int64_t Tlen, int64_t C) {
  // A token may repeat inside the batch, so rows are visited in order (deterministic); the
  // work is tiny next to the matrix products.
  for (int64_t bt = 0; bt < B * Tlen; ++bt) {
    const T* d = dout + bt * C;
    T* te = dwte + static_cast<int64_t>(tokens[bt]) * C;
    T* pe = dwpe + (bt % Tlen) * C;
    for (int64_t i = 0; i < C; ++i) {
      te[i] += d[i];
      pe[i] += d[i];
    }
  }
}

template <typename T>
void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                      int64_t N, int64_t C) {
  const T eps = static_cast<T>(1e-5);
#pragma omp parallel for schedule(static) if (ParallelWorth(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    T m = 0;
    for (int64_t i = 0; i < C; ++i) m += x[i];
    m /= static_cast<T>(C);
    T v = 0;
    for (int64_t i = 0; i < C; ++i) v += (x[i] - m) * (x[i] - m);
    v /= static_cast<T>(C);
    const T s = static_cast<T>(1) / std::sqrt(v + eps);
    T* o = out + n * C;
    for (int64_t i = 0; i < C; ++i) o[i] = (x[i] - m) * s * weight[i] + bias[i];
    mean[n] = m;
    rstd[n] = s;
  }
}

template <typename T>
void LayerNormBackwardInput(T* dinp, const T* dout, const T* inp, const T* weight,
                            const T* mean, const T* rstd, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (ParallelWorth(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const T* d = dout + n * C;
    const T* x = inp + n * C;
    const T m = mean[n], s = rstd[n];
    T dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int64_t i = 0; i < C; ++i) {
      const T dnorm = weight[i] * d[i];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * (x[i] - m) * s;
    }
    dnorm_mean /= static_cast<T>(C);
    dnorm_norm_mean /= static_cast<T>(C);
    T* di = dinp + n * C;
    for (int64_t i = 0; i < C; ++i) {
      const T norm = (x[i] - m) * s;
      di[i] += (weight[i] * d[i] - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
}

template <typename T>
void LayerNormBackwardWeight(T* dweight, T* dbias, const T* dout, const T* inp, const T* mean,
                             const T* rstd, int64_t N, int64_t C) {
  ForEachColumnBlock(C, N * C, [&](int64_t lo, int64_t hi) {
    for (int64_t n = 0; n < N; ++n) {
      const T* d = dout + n * C;
      const T* x = inp + n * C;
      const T m = mean[n], s = rstd[n];
      for (int64_t i = lo; i < hi; ++i) {
        dweight[i] += (x[i] - m) * s * d[i];
        dbias[i] += d[i];
      }
    }
  });
}

template <typename T>
void MatmulForward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C,
                   int64_t OC) {
  T beta = 0;
  if (bias != nullptr) {
#pragma omp parallel for schedule(static) if (ParallelWorth(N * OC))
    for (int64_t n = 0; n < N; ++n) std::memcpy(out + n * OC, bias, OC * sizeof(T));
    beta = 1;
  }
  Gemm<T>(false, true, N, OC, C, 1, inp, C, weight, C, beta, out, OC);
}

template <typename T>
void MatmulBackwardInput(T* dinp, const T* dout, const T* weight, int64_t N, int64_t C,
                         int64_t OC) {
  Gemm<T>(false, false, N, C, OC, 1, dout, OC, weight, C, 0, dinp, C);
}

template <typename T>
void MatmulBackwardWeight(T* dweight, T* dbias, const T* dout, const T* inp, int64_t N,
                          int64_t C, int64_t OC) {
  Gemm<T>(true, false, OC, C, N, 1, dout, OC, inp, C, 1, dweight, C);
  if (dbias == nullptr) return;
  ForEachColumnBlock(OC, N * OC, [&](int64_t lo, int64_t hi) {
    for (int64_t n = 0; n < N; ++n) {
      const T* d = dout + n * OC;
      for (int64_t o = lo; o < hi; ++o) dbias[o] += d[o];
    }
  });
}

// GPT-2's multi-head attention is grouped-query attention with a key/value head per query head.
template <typename T>
void AttentionForward(T* out, T* att, const T* qkv, int64_t B, int64_t Tlen, int64_t C,
                      int64_t NH) {
  GqaAttentionForward(out, att, qkv, B, Tlen, NH, NH, C / NH);
}

template <typename T>
void AttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* att, int64_t B,
                       int64_t Tlen, int64_t C, int64_t NH) {
  GqaAttentionBackward(dqkv, dout, qkv, att, B, Tlen, NH, NH, C / NH);
}

namespace {
template <typename T>
constexpr T kGeluScale = static_cast<T>(0.7978845608028654);  // sqrt(2/pi)
}  // namespace

template <typename T>
void GeluForward(T* out, const T* inp, int64_t N) {
#pragma omp parallel for schedule(static) if (ParallelWorth(N))
  for (int64_t i = 0; i < N; ++i) {
    const T x = inp[i];
    const T cube = static_cast<T>(0.044715) * x * x * x;
    out[i] = static_cast<T>(0.5) * x * (1 + VecTanh(kGeluScale<T> * (x + cube)));
  }
}

template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, int64_t N) {
#pragma omp parallel for schedule(static) if (ParallelWorth(N))
  for (int64_t i = 0; i < N; ++i) {
    const T x = inp[i];
    const T cube = static_cast<T>(0.044715) * x * x * x;
    const T arg = kGeluScale<T> * (x + cube);
    const T th = VecTanh(arg);
    const T sech2 = 1 - th * th;
    const T local = static_cast<T>(0.5) * (1 + th) +
                    static_cast<T>(0.5) * x * sech2 * kGeluScale<T> *
                        (1 + static_cast<T>(3.0 * 0.044715) * x * x);
    dinp[i] = local * dout[i];
  }
}

template <typename T>
void ResidualForward(T* out, const T* a, const T* b, int64_t N) {
#pragma omp parallel for schedule(static) if (ParallelWorth(N))
  for (int64_t i = 0; i < N; ++i) out[i] = a[i] + b[i];
}

template <typename T>
void AddInPlace(T* a, const T* b, int64_t N) {
#pragma omp parallel for schedule(static) if (ParallelWorth(N))
  for (int64_t i = 0; i < N; ++i) a[i] += b[i];
}

template <typename T>
void CrossEntropyForward(T* losses, T* logsumexp, const T* logits, const int32_t* targets,
                         int64_t N, int64_t V, int64_t Vp) {
#pragma omp parallel for schedule(static) if (ParallelWorth(N * V))
  for (int64_t n = 0; n < N; ++n) {
    const T* l = logits + n * Vp;
    T maxval = -std::numeric_limits<T>::infinity();
    for (int64_t v = 0; v < V; ++v) maxval = std::max(maxval, l[v]);
    T sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += VecExp(l[v] - maxval);
    logsumexp[n] = maxval + std::log(sum);
    losses[n] = logsumexp[n] - l[targets[n]];
  }
}

template <typename T>
void CrossEntropyBackward(T* dlogits, const T* logits, const T* logsumexp,
                          const int32_t* targets, T scale, int64_t N, int64_t V, int64_t Vp) {
#pragma omp parallel for schedule(static) if (ParallelWorth(N * V))
  for (int64_t n = 0; n < N; ++n) {
    const T* l = logits + n * Vp;
    T* d = dlogits + n * Vp;
    const T lse = logsumexp[n];
    for (int64_t v = 0; v < V; ++v) d[v] = VecExp(l[v] - lse) * scale;
    for (int64_t v = V; v < Vp; ++v) d[v] = 0;
    d[targets[n]] -= scale;
  }
}

#define FR_INSTANTIATE_KERNELS(T)                                                             \
  template void EncoderForward<T>(T*, const int32_t*, const T*, const T*, int64_t, int64_t,    \
                                  int64_t);                                                   \
  template void EncoderBackwardWeight<T>(T*, T*, const T*, const int32_t*, int64_t, int64_t,   \
                                         int64_t);                                            \
  template void LayerNormForward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t,         \
                                    int64_t);                                                 \
  template void LayerNormBackwardInput<T>(T*, const T*, const T*, const T*, const T*,          \
                                          const T*, int64_t, int64_t);                        \
  template void LayerNormBackwardWeight<T>(T*, T*, const T*, const T*, const T*, const T*,     \
                                           int64_t, int64_t);                                 \
  template void MatmulForward<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t); \
  template void MatmulBackwardInput<T>(T*, const T*, const T*, int64_t, int64_t, int64_t);     \
  template void MatmulBackwardWeight<T>(T*, T*, const T*, const T*, int64_t, int64_t,          \
                                        int64_t);                                             \
  template void AttentionForward<T>(T*, T*, const T*, int64_t, int64_t, int64_t, int64_t);     \
  template void AttentionBackward<T>(T*, const T*, const T*, const T*, int64_t, int64_t,       \
                                     int64_t, int64_t);                                       \
  template void GeluForward<T>(T*, const T*, int64_t);                                        \
  template void GeluBackward<T>(T*, const T*, const T*, int64_t);                             \
  template void ResidualForward<T>(T*, const T*, const T*, int64_t);                          \
  template void AddInPlace<T>(T*, const T*, int64_t);                                         \
  template void CrossEntropyForward<T>(T*, T*, const T*, const int32_t*, int64_t, int64_t,     \
                                       int64_t);                                              \
  template void CrossEntropyBackward<T>(T*, const T*, const T*, const int32_t*, T, int64_t,    \
                                        int64_t, int64_t);

FR_INSTANTIATE_KERNELS(float)
FR_INSTANTIATE_KERNELS(double)
#undef FR_INSTANTIATE_KERNELS

}  // namespace freeride::cpu
