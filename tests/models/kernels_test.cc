// Every CPU kernel's backward pass against finite differences of its forward pass, in float64.
// The scalar loss is Σ out ⊙ R for a fixed random R, so d loss / d out = R.
#include "models/cpu/kernels.h"

#include "tests/models/grad_check.h"

namespace freeride::cpu {
namespace {

using testing::Dot;
using testing::ExpectGradientsMatch;
using testing::RandomVector;

TEST(KernelsTest, LayerNormGradients) {
  const int64_t N = 6, C = 10;
  auto x = RandomVector(N * C, 1), w = RandomVector(C, 2), b = RandomVector(C, 3);
  const auto R = RandomVector(N * C, 4);
  std::vector<double> out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    return Dot(R, out.data());
  };
  loss();
  std::vector<double> dx(N * C, 0), dw(C, 0), db(C, 0);
  LayerNormBackwardInput(dx.data(), R.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
  LayerNormBackwardWeight(dw.data(), db.data(), R.data(), x.data(), mean.data(), rstd.data(), N,
                          C);
  ExpectGradientsMatch("layernorm dinp", x, dx, loss);
  ExpectGradientsMatch("layernorm dweight", w, dw, loss);
  ExpectGradientsMatch("layernorm dbias", b, db, loss);
}

TEST(KernelsTest, MatmulGradients) {
  const int64_t N = 5, C = 7, OC = 9;
  auto x = RandomVector(N * C, 5), w = RandomVector(OC * C, 6), b = RandomVector(OC, 7);
  const auto R = RandomVector(N * OC, 8);
  std::vector<double> out(N * OC);
  auto loss = [&] {
    MatmulForward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
    return Dot(R, out.data());
  };
  loss();
  std::vector<double> dx(N * C), dw(OC * C, 0), db(OC, 0);
  MatmulBackwardInput(dx.data(), R.data(), w.data(), N, C, OC);
  MatmulBackwardWeight(dw.data(), db.data(), R.data(), x.data(), N, C, OC);
  ExpectGradientsMatch("matmul dinp", x, dx, loss);
  ExpectGradientsMatch("matmul dweight", w, dw, loss);
  ExpectGradientsMatch("matmul dbias", b, db, loss);
}

TEST(KernelsTest, MatmulWeightGradientsAccumulate) {
  const int64_t N = 3, C = 4, OC = 2;
  const auto x = RandomVector(N * C, 9), R = RandomVector(N * OC, 10);
  std::vector<double> once(OC * C, 0), twice(OC * C, 0), db1(OC, 0), db2(OC, 0);
  MatmulBackwardWeight(once.data(), db1.data(), R.data(), x.data(), N, C, OC);
  MatmulBackwardWeight(twice.data(), db2.data(), R.data(), x.data(), N, C, OC);
  MatmulBackwardWeight(twice.data(), db2.data(), R.data(), x.data(), N, C, OC);
  for (int64_t i = 0; i < OC * C; ++i) EXPECT_NEAR(twice[i], 2 * once[i], 1e-12);
  for (int64_t i = 0; i < OC; ++i) EXPECT_NEAR(db2[i], 2 * db1[i], 1e-12);
}

TEST(KernelsTest, AttentionGradientsAndCausality) {
  const int64_t B = 2, T = 5, C = 8, NH = 2;
  auto qkv = RandomVector(B * T * 3 * C, 11);
  const auto R = RandomVector(B * T * C, 12);
  std::vector<double> out(B * T * C), att(B * NH * T * T);
  auto loss = [&] {
    AttentionForward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    return Dot(R, out.data());
  };
  loss();
  // Causal: a row attends to itself and the past only, and sums to 1.
  for (int64_t row = 0; row < B * NH * T; ++row) {
    const int64_t t = row % T;
    double sum = 0;
    for (int64_t t2 = 0; t2 < T; ++t2) {
      if (t2 > t) {
        EXPECT_EQ(att[row * T + t2], 0.0);
      }
      sum += att[row * T + t2];
    }
    EXPECT_NEAR(sum, 1.0, 1e-12);
  }
  std::vector<double> dqkv(qkv.size());
  AttentionBackward(dqkv.data(), R.data(), qkv.data(), att.data(), B, T, C, NH);
  ExpectGradientsMatch("attention dqkv", qkv, dqkv, loss);
}

TEST(KernelsTest, GeluGradientsAndValues) {
  const int64_t N = 40;
  auto x = RandomVector(N, 13, 2.0);
  const auto R = RandomVector(N, 14);
  std::vector<double> out(N);
  auto loss = [&] {
    GeluForward(out.data(), x.data(), N);
    return Dot(R, out.data());
  };
  loss();
  // GELU(1) with the tanh approximation (closed form).
  std::vector<double> one{1.0}, g(1);
  GeluForward(g.data(), one.data(), 1);
  EXPECT_NEAR(g[0], 0.5 * (1 + std::tanh(std::sqrt(2 / M_PI) * (1 + 0.044715))), 1e-15);
  std::vector<double> dx(N);
  GeluBackward(dx.data(), x.data(), R.data(), N);
  ExpectGradientsMatch("gelu dinp", x, dx, loss);
}

TEST(KernelsTest, CrossEntropyIgnoresPaddedLogits) {
  const int64_t N = 4, V = 6, Vp = 8;
  auto logits = RandomVector(N * Vp, 15);
  const std::vector<int32_t> targets{0, 5, 2, 3};
  std::vector<double> losses(N), lse(N);
  auto loss = [&] {
    CrossEntropyForward(losses.data(), lse.data(), logits.data(), targets.data(), N, V, Vp);
    double s = 0;
    for (double l : losses) s += l;
    return s;
  };
  const double base = loss();
  // Closed form for row 0.
  double z = 0;
  for (int64_t v = 0; v < V; ++v) z += std::exp(logits[v]);
  EXPECT_NEAR(losses[0], std::log(z) - logits[0], 1e-12);
  // Padded logits change nothing.
  logits[V] += 100;
  EXPECT_EQ(loss(), base);
  logits[V] -= 100;
  std::vector<double> dlogits(N * Vp);
  CrossEntropyBackward(dlogits.data(), logits.data(), lse.data(), targets.data(), 1.0, N, V, Vp);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t v = V; v < Vp; ++v) EXPECT_EQ(dlogits[n * Vp + v], 0.0);
  }
  ExpectGradientsMatch("cross-entropy dlogits", logits, dlogits, loss);
}

TEST(KernelsTest, EncoderGradientsWithRepeatedTokens) {
  const int64_t B = 2, T = 3, C = 4, V = 5;
  auto wte = RandomVector(V * C, 16), wpe = RandomVector(T * C, 17);
  const std::vector<int32_t> tokens{1, 3, 1, 4, 1, 0};
  const auto R = RandomVector(B * T * C, 18);
  std::vector<double> out(B * T * C);
  auto loss = [&] {
    EncoderForward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return Dot(R, out.data());
  };
  loss();
  std::vector<double> dwte(V * C, 0), dwpe(T * C, 0);
  EncoderBackwardWeight(dwte.data(), dwpe.data(), R.data(), tokens.data(), B, T, C);
  ExpectGradientsMatch("encoder dwte", wte, dwte, loss);
  ExpectGradientsMatch("encoder dwpe", wpe, dwpe, loss);
}

}  // namespace
}  // namespace freeride::cpu
