// Each CUDA kernel against the CPU backend's (models/cpu/kernels.h) on random inputs: fp32
// within 1e-5 relative, bf16 within 1e-2 (inputs rounded to bf16 first, so the difference is
// only the kernel's own rounding). Every shape is small: the emulation build
// (tests/gpu/emulated.h) runs them all.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/cuda_check.h"
#include "gtest/gtest.h"
#include "models/cpu/kernels.h"
#include "models/cuda/kernels.h"
#include "models/cuda/matmul.h"
#include "models/device_reductions.h"
#include "models/token_buckets.h"
#include "tests/gpu/device_array.h"
#include "tests/gpu/emulated.h"
#include "tests/gpu/relative_error.h"

namespace freeride {
namespace {

using cuda::bf16;

using testing::AsDevice;
using testing::DeviceArray;
using testing::Random;
using testing::RelativeError;
using testing::Tolerance;

template <typename T>
class CudaKernelsTest : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(CudaKernelsTest, ElementTypes);

constexpr int64_t kB = 2, kT = 16, kC = 64, kNH = 4, kN = kB * kT;

TYPED_TEST(CudaKernelsTest, LayerNormForwardAndBackward) {
  using T = TypeParam;
  testing::PrintShapes({"N 32 (B 2 T 16) C 64"});
  const auto x = AsDevice<T>(Random(kN * kC, 1)), w = AsDevice<T>(Random(kC, 2));
  const auto b = AsDevice<T>(Random(kC, 3)), dout = AsDevice<T>(Random(kN * kC, 4));
  std::vector<float> out(kN * kC), mean(kN), rstd(kN), dinp(kN * kC, 0), dw(kC, 0), db(kC, 0);
  cpu::LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), kN, kC);
  cpu::LayerNormBackwardInput(dinp.data(), dout.data(), x.data(), w.data(), mean.data(),
                              rstd.data(), kN, kC);
  cpu::LayerNormBackwardWeight(dw.data(), db.data(), dout.data(), x.data(), mean.data(),
                               rstd.data(), kN, kC);
  DeviceArray<T> d_x(x), d_w(w), d_b(b), d_dout(dout), d_out(kN * kC), d_dinp(kN * kC);
  DeviceArray<float> d_mean(kN), d_rstd(kN), d_dw(kC), d_db(kC), partials(2 * kColumnChunks * kC);
  cuda::LayerNormForward(d_out.get(), d_mean.get(), d_rstd.get(), d_x.get(), d_w.get(), d_b.get(),
                         kN, kC, nullptr);
  cuda::LayerNormBackwardInput(d_dinp.get(), d_dout.get(), d_x.get(), d_w.get(), d_mean.get(),
                               d_rstd.get(), kN, kC, nullptr);
  cuda::LayerNormBackwardWeight(d_dw.get(), d_db.get(), d_dout.get(), d_x.get(), d_mean.get(),
                                d_rstd.get(), kN, kC, partials.get(), nullptr);
  EXPECT_LT(RelativeError(d_out.Get(), out), Tolerance<T>());
  EXPECT_LT(RelativeError(d_mean.Get(), mean), 1e-5);
  EXPECT_LT(RelativeError(d_rstd.Get(), rstd), 1e-5);
  EXPECT_LT(RelativeError(d_dinp.Get(), dinp), Tolerance<T>());
  EXPECT_LT(RelativeError(d_dw.Get(), dw), Tolerance<T>());
  EXPECT_LT(RelativeError(d_db.Get(), db), Tolerance<T>());
}

TYPED_TEST(CudaKernelsTest, EncoderForwardAndBackward) {
  using T = TypeParam;
  const int64_t V = 50;
  testing::PrintShapes({"B 2 T 16 C 64 V 50"});
  std::vector<int32_t> tokens(kN);
  std::mt19937 rng(5);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 7);  // repeats on purpose
  const auto wte = AsDevice<T>(Random(V * kC, 6)), wpe = AsDevice<T>(Random(kT * kC, 7));
  const auto dout = AsDevice<T>(Random(kN * kC, 8));
  std::vector<float> out(kN * kC), dwte(V * kC, 0), dwpe(kT * kC, 0);
  cpu::EncoderForward(out.data(), tokens.data(), wte.data(), wpe.data(), kB, kT, kC);
  cpu::EncoderBackwardWeight(dwte.data(), dwpe.data(), dout.data(), tokens.data(), kB, kT, kC);
  const TokenBuckets buckets = GroupPositionsByToken(tokens.data(), kN, V);
  const std::vector<int32_t>& positions = buckets.positions;
  const std::vector<int32_t>& distinct = buckets.tokens;
  const std::vector<int32_t>& starts = buckets.starts;
  int32_t *d_tokens, *d_pos, *d_distinct, *d_starts;
  const std::vector<int32_t>& token_ids = tokens;
  for (auto [dst, src] : {std::pair{&d_tokens, &token_ids}, std::pair{&d_pos, &positions},
                          std::pair{&d_distinct, &distinct}, std::pair{&d_starts, &starts}}) {
    ASSERT_EQ(cudaMalloc(dst, src->size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(*dst, src->data(), src->size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  }
  DeviceArray<T> d_wte(wte), d_wpe(wpe), d_dout(dout), d_out(kN * kC);
  DeviceArray<float> d_dwte(V * kC), d_dwpe(kT * kC);
  cuda::EncoderForward(d_out.get(), d_tokens, d_wte.get(), d_wpe.get(), kB, kT, kC, nullptr);
  cuda::EncoderBackwardWeight(d_dwte.get(), d_dwpe.get(), d_dout.get(), d_pos, d_distinct, d_starts,
                              static_cast<int64_t>(distinct.size()), kB, kT, kC, nullptr);
  EXPECT_LT(RelativeError(d_out.Get(), out), Tolerance<T>());
  EXPECT_LT(RelativeError(d_dwte.Get(), dwte), 1e-5);
  EXPECT_LT(RelativeError(d_dwpe.Get(), dwpe), 1e-5);
  for (int32_t* p : {d_tokens, d_pos, d_distinct, d_starts}) cudaFree(p);
}

TYPED_TEST(CudaKernelsTest, GeluResidualAndCrossEntropy) {
  using T = TypeParam;
  const int64_t V = 100, Vp = 128, n = kN * 4 * kC;
  testing::PrintShapes({"elementwise 32 × 256", "cross-entropy N 32 V 100 of 128"});
  const auto x = AsDevice<T>(Random(n, 9)), dout = AsDevice<T>(Random(n, 10));
  std::vector<float> gelu(n), dgelu(n), sum(n);
  cpu::GeluForward(gelu.data(), x.data(), n);
  cpu::GeluBackward(dgelu.data(), x.data(), dout.data(), n);
  cpu::ResidualForward(sum.data(), x.data(), dout.data(), n);
  DeviceArray<T> d_x(x), d_dout(dout), d_gelu(n), d_dgelu(n), d_sum(n);
  cuda::GeluForward(d_gelu.get(), d_x.get(), n, nullptr);
  cuda::GeluBackward(d_dgelu.get(), d_x.get(), d_dout.get(), n, nullptr);
  cuda::ResidualForward(d_sum.get(), d_x.get(), d_dout.get(), n, nullptr);
  EXPECT_LT(RelativeError(d_gelu.Get(), gelu), Tolerance<T>());
  EXPECT_LT(RelativeError(d_dgelu.Get(), dgelu), Tolerance<T>());
  EXPECT_LT(RelativeError(d_sum.Get(), sum), Tolerance<T>());

  const auto logits = AsDevice<T>(Random(kN * Vp, 11, 3.0f));
  std::vector<int32_t> targets(kN);
  for (int64_t i = 0; i < kN; ++i) targets[i] = static_cast<int32_t>((i * 37) % V);
  std::vector<float> losses(kN), lse(kN), dlogits(kN * Vp);
  cpu::CrossEntropyForward(losses.data(), lse.data(), logits.data(), targets.data(), kN, V, Vp);
  cpu::CrossEntropyBackward(dlogits.data(), logits.data(), lse.data(), targets.data(), 0.5f, kN, V,
                            Vp);
  int32_t* d_targets;
  ASSERT_EQ(cudaMalloc(&d_targets, kN * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_targets, targets.data(), kN * 4, cudaMemcpyHostToDevice), cudaSuccess);
  DeviceArray<T> d_logits(logits);
  DeviceArray<float> d_losses(kN), d_lse(kN);
  cuda::CrossEntropyForward(d_losses.get(), d_lse.get(), d_logits.get(), d_targets, kN, V, Vp,
                            nullptr);
  EXPECT_LT(RelativeError(d_losses.Get(), losses), 1e-5);
  cuda::CrossEntropyBackward(d_logits.get(), d_lse.get(), d_targets, 0.5f, kN, V, Vp, nullptr);
  EXPECT_LT(RelativeError(d_logits.Get(), dlogits), Tolerance<T>());
  cudaFree(d_targets);
}

TYPED_TEST(CudaKernelsTest, MatmulsWithFusedBiasAndGelu) {
  using T = TypeParam;
  const int64_t C = kC, OC = 4 * kC;
  testing::PrintShapes({"N 32 C 64 OC 256"});
  const auto inp = AsDevice<T>(Random(kN * C, 12)), w = AsDevice<T>(Random(OC * C, 13, 0.1f));
  const auto bias = AsDevice<T>(Random(OC, 14)), dout = AsDevice<T>(Random(kN * OC, 15));
  std::vector<float> pre(kN * OC), post(kN * OC), dinp(kN * C), dw(OC * C, 0), db(OC, 0);
  cpu::MatmulForward(pre.data(), inp.data(), w.data(), bias.data(), kN, C, OC);
  cpu::GeluForward(post.data(), AsDevice<T>(pre).data(), kN * OC);
  cpu::MatmulBackwardInput(dinp.data(), dout.data(), w.data(), kN, C, OC);
  cpu::MatmulBackwardWeight(dw.data(), db.data(), dout.data(), inp.data(), kN, C, OC);
  cuda::BlasContext ctx;
  ASSERT_EQ(cublasLtCreate(&ctx.lt), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasCreate(&ctx.blas), CUBLAS_STATUS_SUCCESS);
  ctx.workspace_bytes = kCublasLtWorkspaceBytes;
  ASSERT_EQ(cudaMalloc(&ctx.workspace, ctx.workspace_bytes), cudaSuccess);
  DeviceArray<T> d_inp(inp), d_w(w), d_bias(bias), d_dout(dout), d_pre(kN * OC), d_post(kN * OC);
  DeviceArray<T> d_dinp(kN * C), d_plain(kN * OC);
  DeviceArray<float> d_dw(OC * C), d_db(OC), partials(kColumnChunks * OC);
  ASSERT_TRUE(cuda::MatmulForward<T>(ctx, d_plain.get(), d_inp.get(), d_w.get(), d_bias.get(), kN,
                                     C, OC).ok());
  ASSERT_TRUE(cuda::MatmulForward<T>(ctx, d_post.get(), d_inp.get(), d_w.get(), d_bias.get(), kN, C,
                                     OC, cuda::GeluFusion::kForward, d_pre.get()).ok());
  ASSERT_TRUE(cuda::MatmulBackwardInput<T>(ctx, d_dinp.get(), d_dout.get(), d_w.get(), kN, C, OC)
                  .ok());
  ASSERT_TRUE(cuda::MatmulBackwardWeight<T>(ctx, d_dw.get(), d_dout.get(), d_inp.get(), kN, C, OC)
                  .ok());
  cuda::BiasBackward(d_db.get(), d_dout.get(), kN, OC, partials.get(), nullptr);
  EXPECT_LT(RelativeError(d_plain.Get(), pre), Tolerance<T>());
  EXPECT_LT(RelativeError(d_pre.Get(), pre), Tolerance<T>()) << "GELU_AUX_BIAS pre-activation";
  EXPECT_LT(RelativeError(d_post.Get(), post), Tolerance<T>()) << "GELU_AUX_BIAS output";
  EXPECT_LT(RelativeError(d_dinp.Get(), dinp), Tolerance<T>());
  EXPECT_LT(RelativeError(d_dw.Get(), dw), Tolerance<T>());
  EXPECT_LT(RelativeError(d_db.Get(), db), Tolerance<T>());

  // DGELU: (dout · W) ⊙ GELU'(pre), for a layer fed by a GELU of width OC.
  const auto dy = AsDevice<T>(Random(kN * C, 16));
  std::vector<float> dpost(kN * OC), dpre(kN * OC);
  cpu::MatmulBackwardInput(dpost.data(), dy.data(), AsDevice<T>(Random(C * OC, 17, 0.1f)).data(),
                           kN, OC, C);
  cpu::GeluBackward(dpre.data(), AsDevice<T>(pre).data(), AsDevice<T>(dpost).data(), kN * OC);
  DeviceArray<T> d_dy(dy), d_w2(AsDevice<T>(Random(C * OC, 17, 0.1f))), d_dpre(kN * OC);
  ASSERT_TRUE(cuda::MatmulBackwardInput<T>(ctx, d_dpre.get(), d_dy.get(), d_w2.get(), kN, OC, C,
                                           cuda::GeluFusion::kBackward, d_pre.get()).ok());
  EXPECT_LT(RelativeError(d_dpre.Get(), dpre), 10 * Tolerance<T>()) << "DGELU epilogue";
  cudaFree(ctx.workspace);
  cublasDestroy(ctx.blas);
  cublasLtDestroy(ctx.lt);
}

TEST(CudaKernelsTest, SumOfSquaresMatchesFloat64) {
  const int64_t n = 100003;
  testing::PrintShapes({"n 100003"});
  const auto x = Random(n, 18);
  double want = 0;
  for (float v : x) want += double(v) * v;
  DeviceArray<float> d_x(x);
  double *d_out, *partials, got = 0;
  ASSERT_EQ(cudaMalloc(&d_out, 8), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&partials, kReduceBlocks * 8), cudaSuccess);
  cuda::SumOfSquares(d_out, d_x.get(), n, false, partials, nullptr);
  ASSERT_EQ(cudaMemcpy(&got, d_out, 8, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_NEAR(got, want, 1e-12 * want);
  cudaFree(d_out);
  cudaFree(partials);
}

}  // namespace
}  // namespace freeride
