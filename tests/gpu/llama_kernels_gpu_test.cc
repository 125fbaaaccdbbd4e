// Each Llama CUDA kernel (models/cuda/llama_kernels.h) against the CPU backend's
// (models/cpu/llama_kernels.h) on random inputs: fp32 within 1e-5 relative, bf16 within 1e-2
// (tests/gpu/device_array.h). Grouped-query attention is checked as the chunk runs it on the
// reference path: heads split out with their key/value head, GPT-2's batched products and
// causal softmax kernels, heads merged back. Every shape is small: the emulation build runs
// them all.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "models/cpu/llama_kernels.h"
#include "models/cuda/kernels.h"
#include "models/cuda/llama_kernels.h"
#include "models/cuda/matmul.h"
#include "models/device_reductions.h"
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
class LlamaKernelsTest : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(LlamaKernelsTest, ElementTypes);

// hs 16 and a group of two query heads per key/value head: NH 4, NKV 2.
constexpr int64_t kB = 2, kT = 16, kC = 64, kNH = 4, kNKV = 2, kHs = kC / kNH, kN = kB * kT;
constexpr int64_t kQkv = (kNH + 2 * kNKV) * kHs;

TYPED_TEST(LlamaKernelsTest, RMSNormForwardAndBackward) {
  using T = TypeParam;
  testing::PrintShapes({"N 32 C 64"});
  const float eps = 1e-5f;
  const auto x = AsDevice<T>(Random(kN * kC, 1)), w = AsDevice<T>(Random(kC, 2));
  const auto dout = AsDevice<T>(Random(kN * kC, 3)), dres = AsDevice<T>(Random(kN * kC, 4));
  std::vector<float> out(kN * kC), rstd(kN), dinp = dres, dw(kC, 0);
  cpu::RMSNormForward(out.data(), rstd.data(), x.data(), w.data(), eps, kN, kC);
  cpu::RMSNormBackwardInput(dinp.data(), dout.data(), x.data(), w.data(), rstd.data(), kN, kC);
  cpu::RMSNormBackwardWeight(dw.data(), dout.data(), x.data(), rstd.data(), kN, kC);
  DeviceArray<T> d_x(x), d_w(w), d_dout(dout), d_out(kN * kC), d_dinp(dres);
  DeviceArray<float> d_rstd(kN), d_dw(kC), partials(kColumnChunks * kC);
  cuda::RMSNormForward(d_out.get(), d_rstd.get(), d_x.get(), d_w.get(), eps, kN, kC, nullptr);
  cuda::RMSNormBackwardInput(d_dinp.get(), d_dout.get(), d_x.get(), d_w.get(), d_rstd.get(), kN, kC,
                             nullptr);
  cuda::RMSNormBackwardWeight(d_dw.get(), d_dout.get(), d_x.get(), d_rstd.get(), kN, kC,
                              partials.get(), nullptr);
  EXPECT_LT(RelativeError(d_out.Get(), out), Tolerance<T>());
  EXPECT_LT(RelativeError(d_rstd.Get(), rstd), 1e-5);
  EXPECT_LT(RelativeError(d_dinp.Get(), dinp), Tolerance<T>()) << "accumulates onto dinp";
  EXPECT_LT(RelativeError(d_dw.Get(), dw), Tolerance<T>());
}

TYPED_TEST(LlamaKernelsTest, RopeRotatesQAndKAndBack) {
  using T = TypeParam;
  testing::PrintShapes({"B 2 T 16 NH 4 NKV 2 hs 16 theta 500000"});
  std::vector<float> cos, sin;
  cpu::RopeTables(&cos, &sin, kT, kHs, 500000.0);
  const auto qkv = AsDevice<T>(Random(kN * kQkv, 5));
  std::vector<float> rotated = qkv;
  cpu::RopeInPlace(rotated.data(), cos.data(), sin.data(), kB, kT, kNH + kNKV, kHs, kQkv, false);
  DeviceArray<T> d_qkv(qkv);
  DeviceArray<float> d_cos(cos), d_sin(sin);
  cuda::RopeInPlace(d_qkv.get(), d_cos.get(), d_sin.get(), kB, kT, kNH + kNKV, kHs, kQkv, false,
                    nullptr);
  const std::vector<float> got = d_qkv.Get();
  EXPECT_LT(RelativeError(got, rotated), Tolerance<T>());
  for (int64_t i = 0; i < kN * kQkv; i += kQkv) {  // v is not rotated: the same bits
    for (int64_t j = (kNH + kNKV) * kHs; j < kQkv; ++j) ASSERT_EQ(got[i + j], qkv[i + j]);
  }
  // The inverse of the CPU's rotation of a gradient, from the device's rounded values.
  std::vector<float> back = AsDevice<T>(got);
  cpu::RopeInPlace(back.data(), cos.data(), sin.data(), kB, kT, kNH + kNKV, kHs, kQkv, true);
  cuda::RopeInPlace(d_qkv.get(), d_cos.get(), d_sin.get(), kB, kT, kNH + kNKV, kHs, kQkv, true,
                    nullptr);
  EXPECT_LT(RelativeError(d_qkv.Get(), back), Tolerance<T>());
  EXPECT_LT(RelativeError(back, qkv), 3 * Tolerance<T>()) << "rotating back restores the input";
}

TYPED_TEST(LlamaKernelsTest, SwiGluForwardAndBackward) {
  using T = TypeParam;
  const int64_t F = 96;  // not a power of two
  testing::PrintShapes({"N 32 F 96"});
  const auto h = AsDevice<T>(Random(kN * 2 * F, 6)), dout = AsDevice<T>(Random(kN * F, 7));
  std::vector<float> out(kN * F), dh(kN * 2 * F);
  cpu::SwiGluForward(out.data(), h.data(), kN, F);
  cpu::SwiGluBackward(dh.data(), h.data(), dout.data(), kN, F);
  DeviceArray<T> d_h(h), d_dout(dout), d_out(kN * F), d_dh(kN * 2 * F);
  cuda::SwiGluForward(d_out.get(), d_h.get(), kN, F, nullptr);
  cuda::SwiGluBackward(d_dh.get(), d_h.get(), d_dout.get(), kN, F, nullptr);
  EXPECT_LT(RelativeError(d_out.Get(), out), Tolerance<T>());
  EXPECT_LT(RelativeError(d_dh.Get(), dh), Tolerance<T>());
}

// A cuBLAS(Lt) context for the batched products.
class Blas {
 public:
  Blas() {
    EXPECT_EQ(cublasLtCreate(&ctx.lt), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasCreate(&ctx.blas), CUBLAS_STATUS_SUCCESS);
    ctx.workspace_bytes = kCublasLtWorkspaceBytes;
    EXPECT_EQ(cudaMalloc(&ctx.workspace, ctx.workspace_bytes), cudaSuccess);
  }
  ~Blas() {
    cudaFree(ctx.workspace);
    cublasDestroy(ctx.blas);
    cublasLtDestroy(ctx.lt);
  }
  cuda::BlasContext ctx;
};

TYPED_TEST(LlamaKernelsTest, GroupedQueryAttentionForwardAndBackward) {
  using T = TypeParam;
  for (int64_t nkv : {kNKV, int64_t{1}, kNH}) {  // groups of 2, multi-query, multi-head
    SCOPED_TRACE(nkv);
    testing::PrintShapes({"B 2 T 16 NH 4 NKV " + std::to_string(nkv) + " hs 16"});
    const int64_t W = (kNH + 2 * nkv) * kHs, BTC = kN * kC, heads = kB * kNH;
    const auto qkv = AsDevice<T>(Random(kN * W, 8, 0.5f)), dout = AsDevice<T>(Random(BTC, 9));
    std::vector<float> out(BTC), att(heads * kT * kT), dqkv(kN * W);
    cpu::GqaAttentionForward(out.data(), att.data(), qkv.data(), kB, kT, kNH, nkv, kHs);
    cpu::GqaAttentionBackward(dqkv.data(), dout.data(), qkv.data(), att.data(), kB, kT, kNH, nkv,
                              kHs);
    Blas blas;
    DeviceArray<T> d_qkv(qkv), d_dout(dout), d_heads(3 * BTC), d_dheads(3 * BTC);
    DeviceArray<T> d_att(heads * kT * kT), d_datt(heads * kT * kT), d_y(BTC), d_out(BTC);
    DeviceArray<T> d_dqkv(kN * W);
    DeviceArray<float> d_lse(heads * kT);
    T* q = d_heads.get();
    T *k = q + BTC, *v = k + BTC, *dq = d_dheads.get(), *dk = dq + BTC, *dv = dk + BTC;
    const float scale = 1.0f / std::sqrt(static_cast<float>(kHs));
    const auto& c = blas.ctx;
    // Forward, as the chunk's reference path runs it.
    cuda::GqaSplitHeads(q, d_qkv.get(), kB, kT, kNH, nkv, kHs, nullptr);
    ASSERT_TRUE(cuda::BatchedGemm<T>(c, false, true, kT, kT, kHs, 1.0f, q, kHs, kT * kHs, k, kHs,
                                     kT * kHs, 0.0f, d_att.get(), kT, kT * kT, heads)
                    .ok());
    cuda::CausalSoftmaxForward(d_att.get(), d_lse.get(), scale, heads * kT, kT, nullptr);
    ASSERT_TRUE(cuda::BatchedGemm<T>(c, false, false, kT, kHs, kT, 1.0f, d_att.get(), kT, kT * kT,
                                     v, kHs, kT * kHs, 0.0f, d_y.get(), kHs, kT * kHs, heads)
                    .ok());
    cuda::MergeHeads(d_out.get(), d_y.get(), kB, kT, kC, kNH, nullptr);
    EXPECT_LT(RelativeError(d_out.Get(), out), Tolerance<T>());
    // Backward: the probabilities from forward, through the softmax, the heads merged back.
    T* dy = d_y.get();
    cuda::SplitHeadsGrad(dy, d_dout.get(), kB, kT, kC, kNH, nullptr);
    ASSERT_TRUE(cuda::BatchedGemm<T>(c, false, true, kT, kT, kHs, 1.0f, dy, kHs, kT * kHs, v, kHs,
                                     kT * kHs, 0.0f, d_datt.get(), kT, kT * kT, heads)
                    .ok());
    ASSERT_TRUE(cuda::BatchedGemm<T>(c, true, false, kT, kHs, kT, 1.0f, d_att.get(), kT, kT * kT,
                                     dy, kHs, kT * kHs, 0.0f, dv, kHs, kT * kHs, heads)
                    .ok());
    cuda::CausalSoftmaxBackward(d_datt.get(), d_att.get(), scale, heads * kT, kT, nullptr);
    ASSERT_TRUE(cuda::BatchedGemm<T>(c, false, false, kT, kHs, kT, 1.0f, d_datt.get(), kT, kT * kT,
                                     k, kHs, kT * kHs, 0.0f, dq, kHs, kT * kHs, heads)
                    .ok());
    ASSERT_TRUE(cuda::BatchedGemm<T>(c, true, false, kT, kHs, kT, 1.0f, d_datt.get(), kT, kT * kT,
                                     q, kHs, kT * kHs, 0.0f, dk, kHs, kT * kHs, heads)
                    .ok());
    cuda::GqaMergeHeadsGrad(d_dqkv.get(), d_dheads.get(), kB, kT, kNH, nkv, kHs, nullptr);
    EXPECT_LT(RelativeError(d_dqkv.Get(), dqkv), 2 * Tolerance<T>());
  }
}

}  // namespace
}  // namespace freeride
