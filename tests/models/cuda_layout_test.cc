// The CUDA backend's index arithmetic and product mappings, checked on the CPU: every linear
// layer's column-major BLAS call (gemm_shapes.h) against the CPU kernels through a reference
// column-major product; the head split/merge of the plain attention (attention_layout.h) and
// its whole forward/backward recipe, as CudaStage composes it (probabilities recomputed in
// backward from each row's log-sum-exp), against cpu::Attention*; the
// embedding backward's token buckets (token_buckets.h) against cpu::EncoderBackwardWeight.
#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "models/cpu/kernels.h"
#include "models/cuda/attention_layout.h"
#include "models/cuda/gemm_shapes.h"
#include "models/token_buckets.h"

namespace freeride {
namespace {

using cuda::ColumnMajorGemm;

// D (+)= op(A)·op(B), column-major, as cuBLAS defines it.
void ReferenceGemm(const ColumnMajorGemm& g, const double* A, const double* B, double* D,
                   bool accumulate, double alpha = 1.0) {
  for (int64_t j = 0; j < g.n; ++j) {
    for (int64_t i = 0; i < g.m; ++i) {
      double sum = 0;
      for (int64_t p = 0; p < g.k; ++p) {
        const double a = g.trans_a ? A[p + i * g.lda] : A[i + p * g.lda];
        const double b = g.trans_b ? B[j + p * g.ldb] : B[p + j * g.ldb];
        sum += a * b;
      }
      D[i + j * g.ldd] = alpha * sum + (accumulate ? D[i + j * g.ldd] : 0.0);
    }
  }
}

std::vector<double> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = normal(rng);
  return v;
}

void ExpectNear(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-9) << "at " << i;
}

TEST(CudaLayoutTest, LinearLayerCallsComputeWhatTheCpuKernelsDo) {
  const int64_t N = 5, C = 4, OC = 6;
  const auto inp = Random(N * C, 1), w = Random(OC * C, 2), dout = Random(N * OC, 3);
  std::vector<double> want(N * OC), got(N * OC);
  cpu::MatmulForward<double>(want.data(), inp.data(), w.data(), nullptr, N, C, OC);
  ReferenceGemm(cuda::LinearForward(N, C, OC), w.data(), inp.data(), got.data(), false);
  ExpectNear(got, want);

  std::vector<double> dinp_want(N * C), dinp(N * C);
  cpu::MatmulBackwardInput<double>(dinp_want.data(), dout.data(), w.data(), N, C, OC);
  ReferenceGemm(cuda::LinearBackwardInput(N, C, OC), w.data(), dout.data(), dinp.data(), false);
  ExpectNear(dinp, dinp_want);

  std::vector<double> dw_want = Random(OC * C, 4), dw = dw_want;  // accumulates
  cpu::MatmulBackwardWeight<double>(dw_want.data(), nullptr, dout.data(), inp.data(), N, C, OC);
  ReferenceGemm(cuda::LinearBackwardWeight(N, C, OC), inp.data(), dout.data(), dw.data(), true);
  ExpectNear(dw, dw_want);
}

TEST(CudaLayoutTest, RowMajorProductsSwapOperandsCorrectly) {
  const int64_t M = 3, N = 5, K = 4;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      // Row-major storage: A is M×K (K×M when transposed), B is K×N (N×K when transposed).
      const int64_t lda = ta ? M : K, ldb = tb ? K : N, ldc = N;
      const auto A = Random(M * K, 5), B = Random(K * N, 6);
      std::vector<double> want(M * N, 0.0), got(M * N, 0.0);
      for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < N; ++j) {
          for (int64_t p = 0; p < K; ++p) {
            const double a = ta ? A[p * lda + i] : A[i * lda + p];
            const double b = tb ? B[j * ldb + p] : B[p * ldb + j];
            want[i * ldc + j] += a * b;
          }
        }
      }
      ReferenceGemm(cuda::RowMajor(ta, tb, M, N, K, lda, ldb, ldc), B.data(), A.data(),
                    got.data(), false);
      ExpectNear(got, want);
    }
  }
}

TEST(CudaLayoutTest, HeadSplitAndMergeArePermutationsOfTheRightElements) {
  const int64_t B = 2, T = 3, C = 8, NH = 2, hs = C / NH;
  std::set<int64_t> seen;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t which = 0; which < 3; ++which) {
        for (int64_t h = 0; h < NH; ++h) {
          for (int64_t d = 0; d < hs; ++d) {
            const int64_t from = (b * T + t) * 3 * C + which * C + h * hs + d;
            const int64_t to = which * B * T * C + ((b * NH + h) * T + t) * hs + d;
            EXPECT_EQ(cuda::QkvToHeadMajor(from, B, T, C, NH), to);
            seen.insert(to);
          }
        }
      }
    }
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), B * T * 3 * C);
  seen.clear();
  for (int64_t i = 0; i < B * T * C; ++i) seen.insert(cuda::OutToHeadMajor(i, T, C, NH));
  EXPECT_EQ(static_cast<int64_t>(seen.size()), B * T * C);
  EXPECT_EQ(*seen.rbegin(), B * T * C - 1);
}

// CudaStage's attention recipe (cuda_stage_passes.cc) step by step on the CPU.
TEST(CudaLayoutTest, PlainAttentionRecipeMatchesTheCpuKernels) {
  const int64_t B = 2, T = 5, C = 8, NH = 2, hs = C / NH, BTC = B * T * C, heads = B * NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  const auto qkv = Random(B * T * 3 * C, 7), dout = Random(BTC, 8);
  std::vector<double> out_want(BTC), att_want(B * NH * T * T), dqkv_want(B * T * 3 * C);
  cpu::AttentionForward(out_want.data(), att_want.data(), qkv.data(), B, T, C, NH);
  cpu::AttentionBackward(dqkv_want.data(), dout.data(), qkv.data(), att_want.data(), B, T, C, NH);

  auto batched = [&](bool ta, bool tb, int64_t M, int64_t N, int64_t K, const double* A,
                     int64_t lda, int64_t sa, const double* Bm, int64_t ldb, int64_t sb, double* Cm,
                     int64_t ldc, int64_t sc) {
    const ColumnMajorGemm g = cuda::RowMajor(ta, tb, M, N, K, lda, ldb, ldc);
    for (int64_t i = 0; i < heads; ++i) ReferenceGemm(g, Bm + i * sb, A + i * sa, Cm + i * sc, false);
  };
  std::vector<double> split(3 * BTC), att(heads * T * T), lse(heads * T), y(BTC), out(BTC);
  for (int64_t i = 0; i < 3 * BTC; ++i) split[cuda::QkvToHeadMajor(i, B, T, C, NH)] = qkv[i];
  const double *q = split.data(), *k = q + BTC, *v = k + BTC;
  batched(false, true, T, T, hs, q, hs, T * hs, k, hs, T * hs, att.data(), T, T * T);
  for (int64_t r = 0; r < heads * T; ++r) {  // causal softmax of scale · scores
    const int64_t t = r % T;
    double* x = att.data() + r * T;
    double mx = -1e300, sum = 0;
    for (int64_t j = 0; j <= t; ++j) mx = std::max(mx, scale * x[j]);
    for (int64_t j = 0; j <= t; ++j) sum += std::exp(scale * x[j] - mx);
    for (int64_t j = 0; j < T; ++j) x[j] = j <= t ? std::exp(scale * x[j] - mx) / sum : 0.0;
    lse[r] = mx + std::log(sum);
  }
  ExpectNear(att, att_want);
  batched(false, false, T, hs, T, att.data(), T, T * T, v, hs, T * hs, y.data(), hs, T * hs);
  for (int64_t i = 0; i < BTC; ++i) out[i] = y[cuda::OutToHeadMajor(i, T, C, NH)];
  ExpectNear(out, out_want);

  std::vector<double> dy(BTC), ds(heads * T * T), dsplit(3 * BTC), dqkv(3 * B * T * C);
  for (int64_t i = 0; i < BTC; ++i) dy[cuda::OutToHeadMajor(i, T, C, NH)] = dout[i];
  // Backward recomputes the probabilities from the scores and each row's log-sum-exp.
  std::fill(att.begin(), att.end(), 0.0);
  batched(false, true, T, T, hs, q, hs, T * hs, k, hs, T * hs, att.data(), T, T * T);
  for (int64_t i = 0; i < heads * T * T; ++i) {
    const int64_t row = i / T, j = i % T, t = row % T;
    att[i] = j <= t ? std::exp(scale * att[i] - lse[row]) : 0.0;
  }
  ExpectNear(att, att_want);
  double *dq = dsplit.data(), *dk = dq + BTC, *dv = dk + BTC;
  batched(false, true, T, T, hs, dy.data(), hs, T * hs, v, hs, T * hs, ds.data(), T, T * T);
  batched(true, false, T, hs, T, att.data(), T, T * T, dy.data(), hs, T * hs, dv, hs, T * hs);
  for (int64_t r = 0; r < heads * T; ++r) {  // through the softmax, times scale
    const int64_t t = r % T;
    double* d = ds.data() + r * T;
    const double* a = att.data() + r * T;
    double weighted = 0;
    for (int64_t j = 0; j <= t; ++j) weighted += a[j] * d[j];
    for (int64_t j = 0; j < T; ++j) d[j] = j <= t ? a[j] * (d[j] - weighted) * scale : 0.0;
  }
  batched(false, false, T, hs, T, ds.data(), T, T * T, k, hs, T * hs, dq, hs, T * hs);
  batched(true, false, T, hs, T, ds.data(), T, T * T, q, hs, T * hs, dk, hs, T * hs);
  for (int64_t i = 0; i < 3 * BTC; ++i) dqkv[i] = dsplit[cuda::QkvToHeadMajor(i, B, T, C, NH)];
  ExpectNear(dqkv, dqkv_want);
}

TEST(TokenBucketsTest, GroupsPositionsByTokenInOrder) {
  const std::vector<int32_t> tokens = {3, 1, 3, 0, 1, 3};
  const TokenBuckets b = GroupPositionsByToken(tokens.data(), 6, 5);
  EXPECT_EQ(b.tokens, (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(b.starts, (std::vector<int32_t>{0, 1, 3, 6}));
  EXPECT_EQ(b.positions, (std::vector<int32_t>{3, 1, 4, 0, 2, 5}));
}

TEST(TokenBucketsTest, BucketedEmbeddingBackwardEqualsTheCpuKernel) {
  const int64_t B = 3, T = 7, C = 5, V = 11;
  std::mt19937 rng(9);
  std::vector<int32_t> tokens(B * T);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 4);  // many repeats
  const auto dout = Random(B * T * C, 10);
  std::vector<double> want(V * C, 0.0), wpe(T * C, 0.0), got(V * C, 0.0);
  cpu::EncoderBackwardWeight(want.data(), wpe.data(), dout.data(), tokens.data(), B, T, C);
  const TokenBuckets b = GroupPositionsByToken(tokens.data(), B * T, V);
  for (size_t u = 0; u < b.tokens.size(); ++u) {
    for (int64_t c = 0; c < C; ++c) {
      double sum = 0;
      for (int32_t k = b.starts[u]; k < b.starts[u + 1]; ++k) sum += dout[b.positions[k] * C + c];
      got[b.tokens[u] * C + c] += sum;
    }
  }
  ExpectNear(got, want);
}

}  // namespace
}  // namespace freeride
