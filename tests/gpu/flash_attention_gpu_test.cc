// The flash attention kernels (models/cuda/flash_attention.h) against the reference path (the
// head split, batched GEMMs over T × T and softmax kernels of kernels.h; grouped-query heads by
// llama_kernels.h's split and merge) run in fp32 on the same bf16-rounded inputs, on the
// attention shapes of the tiny configs and of GPT-2 124M and on grouped-query ones; two runs
// bit for bit; and whole bf16 models trained 10 steps on each path (4 under emulation).
//
// Tolerances (‖a − b‖∞ / ‖b‖∞, the project's bf16 contract for kernels: 1e-2, and the model
// tests' 2e-2 per loss): the output and dq, dk, dv differ from fp32 only by the flash kernels'
// bf16 rounding of P and dS before their products and of the results (about 2⁻⁹ each, a few of
// them compounding): 1e-2 for the output, 2e-2 for the gradients; the log-sum-exp comes from
// fp32 products of the same bf16 inputs: 1e-4.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/cuda/cuda_stage_model.h"
#include "models/cuda/flash_attention.h"
#include "models/cuda/flash_tile.h"
#include "models/cuda/kernels.h"
#include "models/cuda/llama_kernels.h"
#include "models/cuda/matmul.h"
#include "models/device_reductions.h"
#include "tests/gpu/emulated.h"
#include "tests/gpu/relative_error.h"

namespace freeride {
namespace {

using cuda::bf16;
using testing::RelativeError;

struct Shape {
  int64_t B, NH, hs, T;
  int64_t NKV = 0;  // key/value heads of grouped-query attention; 0: one per query head
  int64_t C() const { return NH * hs; }
  int64_t KvHeads() const { return NKV == 0 ? NH : NKV; }
  int64_t QkvWidth() const { return (NH + 2 * KvHeads()) * hs; }  // per token
  std::string Name() const {
    return "B " + std::to_string(B) + " NH " + std::to_string(NH) +
           (NKV == 0 ? "" : " NKV " + std::to_string(NKV)) + " hs " + std::to_string(hs) + " T " +
           std::to_string(T);
  }
};

// bf16 values (as floats), so that both paths see the same inputs.
std::vector<float> RandomBf16(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(static_cast<bf16>(normal(rng)));
  return v;
}

template <typename T>
T* Upload(const std::vector<float>& host) {
  std::vector<T> t(host.begin(), host.end());
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), std::max<size_t>(t.size(), 1) * sizeof(T)),
            cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, t.data(), t.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}
template <typename T>
T* Zeros(int64_t n) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), std::max<int64_t>(n, 1) * sizeof(T)),
            cudaSuccess);
  EXPECT_EQ(cudaMemset(d, 0, std::max<int64_t>(n, 1) * sizeof(T)), cudaSuccess);
  return d;
}
template <typename T>
std::vector<float> Download(const T* d, int64_t n) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<T> t(n);
  EXPECT_EQ(cudaMemcpy(t.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return std::vector<float>(t.begin(), t.end());
}

struct Attention {
  std::vector<float> out, lse, dqkv;
};

Attention Flash(const Shape& s, const std::vector<float>& qkv, const std::vector<float>& dout) {
  const int64_t BTC = s.B * s.T * s.C(), rows = s.B * s.NH * s.T, W = s.B * s.T * s.QkvWidth();
  bf16 *d_qkv = Upload<bf16>(qkv), *d_dout = Upload<bf16>(dout);
  bf16 *d_out = Zeros<bf16>(BTC), *d_dqkv = Zeros<bf16>(W);
  bf16* d_heads = s.NKV == 0 ? nullptr : Zeros<bf16>(2 * BTC);
  float *d_lse = Zeros<float>(rows), *d_rowsum = Zeros<float>(rows);
  cuda::FlashAttentionForward(d_out, d_lse, d_qkv, s.B, s.T, s.NH, s.KvHeads(), s.hs, nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  cuda::FlashAttentionBackward(d_dqkv, d_rowsum, d_heads, d_dout, d_qkv, d_out, d_lse, s.B, s.T,
                               s.NH, s.KvHeads(), s.hs, nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  Attention a{Download(d_out, BTC), Download(d_lse, rows), Download(d_dqkv, W)};
  for (bf16* p : {d_qkv, d_dout, d_out, d_dqkv, d_heads}) cudaFree(p);
  for (float* p : {d_lse, d_rowsum}) cudaFree(p);
  return a;
}

// CudaStage's reference recipe (cuda_stage_passes.cc), in fp32; grouped-query heads copied out
// to their query heads and their gradients summed back (llama_kernels.h).
Attention Reference(const Shape& s, const std::vector<float>& qkv, const std::vector<float>& dout) {
  const int64_t B = s.B, T = s.T, C = s.C(), NH = s.NH, hs = s.hs, BTC = B * T * C, heads = B * NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  cuda::BlasContext ctx;
  EXPECT_EQ(cublasLtCreate(&ctx.lt), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasCreate(&ctx.blas), CUBLAS_STATUS_SUCCESS);
  ctx.workspace_bytes = kCublasLtWorkspaceBytes;
  EXPECT_EQ(cudaMalloc(&ctx.workspace, ctx.workspace_bytes), cudaSuccess);
  EXPECT_EQ(cublasSetWorkspace(ctx.blas, ctx.workspace, ctx.workspace_bytes),
            CUBLAS_STATUS_SUCCESS);
  float *d_qkv = Upload<float>(qkv), *d_dout = Upload<float>(dout);
  float *split = Zeros<float>(3 * BTC), *att = Zeros<float>(heads * T * T);
  float *ds = Zeros<float>(heads * T * T), *y = Zeros<float>(BTC), *out = Zeros<float>(BTC);
  float *lse = Zeros<float>(heads * T), *dsplit = Zeros<float>(3 * BTC);
  const int64_t W = B * T * s.QkvWidth(), NKV = s.KvHeads();
  float* dqkv = Zeros<float>(W);
  float *q = split, *k = q + BTC, *v = k + BTC, *dq = dsplit, *dk = dq + BTC, *dv = dk + BTC;
  auto ok = [](const absl::Status& st) { EXPECT_TRUE(st.ok()) << st; };
  if (s.NKV == 0) {
    cuda::SplitHeads(split, d_qkv, B, T, C, NH, nullptr);
  } else {
    cuda::GqaSplitHeads(split, d_qkv, B, T, NH, NKV, hs, nullptr);
  }
  ok(cuda::BatchedGemm<float>(ctx, false, true, T, T, hs, 1.0f, q, hs, T * hs, k, hs, T * hs, 0.0f,
                              att, T, T * T, heads));
  cuda::CausalSoftmaxForward(att, lse, scale, heads * T, T, nullptr);
  ok(cuda::BatchedGemm<float>(ctx, false, false, T, hs, T, 1.0f, att, T, T * T, v, hs, T * hs, 0.0f,
                              y, hs, T * hs, heads));
  cuda::MergeHeads(out, y, B, T, C, NH, nullptr);
  cuda::SplitHeadsGrad(y, d_dout, B, T, C, NH, nullptr);  // y now holds dy
  ok(cuda::BatchedGemm<float>(ctx, false, true, T, T, hs, 1.0f, y, hs, T * hs, v, hs, T * hs, 0.0f,
                              ds, T, T * T, heads));
  ok(cuda::BatchedGemm<float>(ctx, true, false, T, hs, T, 1.0f, att, T, T * T, y, hs, T * hs, 0.0f,
                              dv, hs, T * hs, heads));
  cuda::CausalSoftmaxBackward(ds, att, scale, heads * T, T, nullptr);
  ok(cuda::BatchedGemm<float>(ctx, false, false, T, hs, T, 1.0f, ds, T, T * T, k, hs, T * hs, 0.0f,
                              dq, hs, T * hs, heads));
  ok(cuda::BatchedGemm<float>(ctx, true, false, T, hs, T, 1.0f, ds, T, T * T, q, hs, T * hs, 0.0f,
                              dk, hs, T * hs, heads));
  if (s.NKV == 0) {
    cuda::MergeHeadsGrad(dqkv, dsplit, B, T, C, NH, nullptr);
  } else {
    cuda::GqaMergeHeadsGrad(dqkv, dsplit, B, T, NH, NKV, hs, nullptr);
  }
  Attention a{Download(out, BTC), Download(lse, heads * T), Download(dqkv, W)};
  for (float* p : {d_qkv, d_dout, split, att, ds, y, out, lse, dsplit, dqkv}) cudaFree(p);
  cudaFree(ctx.workspace);
  cublasDestroy(ctx.blas);
  cublasLtDestroy(ctx.lt);
  return a;
}

// The tiny GPU-test model (hs 16), configs/tiny_cpu.toml (hs 32), hs 64 at a T no tile divides,
// GPT-2 124M (micro-batch 8, T 1024), hs 128 at a T no tile divides, and
// configs/freeride_1b_pp4_m4.toml's layer (16 heads of 128, T 1024) at micro-batch 2 rather
// than 12: the batch only repeats blocks, and the sanitizer passes stay within their budget.
// Then hs 16 and 32 over several tiles with a partial last one (the running softmax rescaled
// across tiles, the dK/dV loop over query tiles). Last, grouped-query attention: groups of two
// (hs 16 over several tiles; hs 128, dK in shared memory) and one key/value head for all
// (multi-query, hs 64): the dK/dV loop over the group's query heads.
const std::vector<Shape> kShapes = {{4, 4, 16, 32},     {2, 4, 32, 64},     {2, 2, 64, 100},
                                    {8, 12, 64, 1024},  {2, 2, 128, 100},   {2, 16, 128, 1024},
                                    {2, 4, 16, 130},    {2, 4, 32, 200},    {2, 4, 16, 130, 2},
                                    {2, 4, 64, 100, 1}, {2, 4, 128, 100, 2}};

// The shapes of `shapes` this build runs: the T 1024 ones are left to real GPUs under
// emulation (tests/gpu/emulated.h); every head size still runs, over several tiles with a
// partial last one.
std::vector<Shape> ShapesToRun(const std::vector<Shape>& shapes) {
  return testing::ShapesToRun(
      shapes, [](const Shape& s) { return s.T <= 256; }, [](const Shape& s) { return s.Name(); });
}

// One of dq, dk, dv (`part` 0, 1, 2) out of the [B·T, (NH + 2·NKV)·hs] gradient: each compared
// on its own scale, so that an error in the smaller ones (the last keys' dK and dV) is not lost
// in dq's.
std::vector<float> Part(const std::vector<float>& dqkv, int part, const Shape& s) {
  const int64_t W = s.QkvWidth(), kv = s.KvHeads() * s.hs;
  const int64_t begin = part == 0 ? 0 : s.C() + (part - 1) * kv, width = part == 0 ? s.C() : kv;
  std::vector<float> out;
  for (size_t row = 0; row < dqkv.size() / W; ++row) {
    const auto at = dqkv.begin() + static_cast<int64_t>(row) * W + begin;
    out.insert(out.end(), at, at + width);
  }
  return out;
}

TEST(FlashAttentionGpuTest, MatchesTheReferencePathForwardAndBackward) {
  for (const Shape& s : ShapesToRun(kShapes)) {
    SCOPED_TRACE(s.Name());
    ASSERT_TRUE(cuda::flash::ShapeSupported(s.B, s.NH, s.hs, s.T));
    const auto qkv = RandomBf16(s.B * s.T * s.QkvWidth(), 1);
    const auto dout = RandomBf16(s.B * s.T * s.C(), 2);
    const Attention want = Reference(s, qkv, dout), got = Flash(s, qkv, dout);
    EXPECT_LT(RelativeError(got.out, want.out), 1e-2);
    EXPECT_LT(RelativeError(got.lse, want.lse), 1e-4);
    for (int part = 0; part < 3; ++part) {
      EXPECT_LT(RelativeError(Part(got.dqkv, part, s), Part(want.dqkv, part, s)), 2e-2)
          << "d"
          << "qkv"[part];
    }
  }
}

// GPT-2 124M's shape, and the 1B config's (hs 128: dK summed in shared memory); under
// emulation the same head sizes at T 100 (a partial tile).
TEST(FlashAttentionGpuTest, TwoRunsAreBitwiseEqual) {
  const std::vector<Shape> shapes = testing::EmulatedInstead<Shape>(
      {kShapes[3], kShapes[5]}, {kShapes[2], kShapes[4]}, [](const Shape& s) { return s.Name(); });
  for (const Shape& s : shapes) {
    SCOPED_TRACE(s.Name());
    const auto qkv = RandomBf16(s.B * s.T * 3 * s.C(), 3), dout = RandomBf16(s.B * s.T * s.C(), 4);
    const Attention a = Flash(s, qkv, dout), b = Flash(s, qkv, dout);
    for (auto [x, y] :
         {std::pair{&a.out, &b.out}, std::pair{&a.lse, &b.lse}, std::pair{&a.dqkv, &b.dqkv}}) {
      ASSERT_EQ(x->size(), y->size());
      EXPECT_EQ(std::memcmp(x->data(), y->data(), x->size() * sizeof(float)), 0);
    }
  }
}

// A whole bf16 model on each path, `steps` optimizer steps on the same batch: the losses agree
// within the bf16 model tolerance at every step (and fall).
std::vector<double> StepLosses(const GPT2Config& cfg, int64_t B, int64_t T, int steps,
                               cuda::AttentionMode attention, std::string* description) {
  CudaStageOptions options;
  options.precision = CudaPrecision::kBf16;
  options.attention = attention;
  auto model = CudaStageModel::Create(cfg, WholeModel(cfg), B, T, 1, options);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  *description = (*model)->Describe();
  EXPECT_TRUE((*model)->InitRandom(21).ok());
  std::mt19937 rng(5);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (auto* v : {&tokens, &targets}) {
    for (int32_t& t : *v) t = static_cast<int32_t>(rng() % cfg.vocab_size);
  }
  std::vector<double> losses;
  for (int64_t step = 1; step <= steps; ++step) {
    EXPECT_TRUE((*model)->ZeroGrads().ok());
    EXPECT_TRUE((*model)->SetTokens(0, tokens.data()).ok());
    EXPECT_TRUE((*model)->SetTargets(0, targets.data()).ok());
    absl::StatusOr<double> loss = (*model)->Forward(0);
    EXPECT_TRUE(loss.ok()) << loss.status();
    losses.push_back(loss.ok() ? *loss : NAN);
    EXPECT_TRUE((*model)->BackwardInput(0, 1.0f / (B * T)).ok());
    EXPECT_TRUE((*model)->BackwardWeight(0).ok());
    EXPECT_TRUE((*model)->FoldHeadWteGrad().ok());
    AdamWStep adam;
    adam.lr = 1e-3;
    adam.step = step;
    EXPECT_TRUE((*model)->ApplyAdamW(adam).ok());
  }
  return losses;
}

TEST(FlashAttentionGpuTest, TenStepLossesFollowTheReferencePath) {
  struct Case {
    int n_head, n_embd;
    int64_t B, T;
  };
  // The GPU tests' tiny model (hs 16), an hs-64 model and an hs-128 one at a T no tile divides
  // (all small enough to emulate).
  const std::vector<Case> cases = testing::ShapesToRun(
      std::vector<Case>{{4, 64, 4, 32}, {2, 128, 2, 100}, {2, 256, 2, 100}},
      [](const Case&) { return true; },
      [](const Case& c) {
        return "2 layers, C " + std::to_string(c.n_embd) + " (hs " +
               std::to_string(c.n_embd / c.n_head) + "), B " + std::to_string(c.B) + " T " +
               std::to_string(c.T);
      });
  const int steps = testing::StepsToRun(10, 4);
  for (const Case& c : cases) {
    absl::StatusOr<GPT2Config> cfg = MakeGPT2Config(2, c.n_head, c.n_embd, c.T, 200);
    ASSERT_TRUE(cfg.ok());
    std::string flash_name, reference_name;
    const std::vector<double> flash =
        StepLosses(*cfg, c.B, c.T, steps, cuda::AttentionMode::kAuto, &flash_name);
    const std::vector<double> reference =
        StepLosses(*cfg, c.B, c.T, steps, cuda::AttentionMode::kReference, &reference_name);
    EXPECT_NE(flash_name.find("flash attention"), std::string::npos) << flash_name;
    EXPECT_EQ(reference_name.find("flash attention"), std::string::npos) << reference_name;
    ASSERT_EQ(flash.size(), static_cast<size_t>(steps));
    ASSERT_EQ(reference.size(), static_cast<size_t>(steps));
    for (size_t i = 0; i < flash.size(); ++i) {
      EXPECT_NEAR(flash[i], reference[i], 2e-2 * reference[i]) << "step " << i + 1;
    }
    EXPECT_LT(flash.back(), flash.front() - 0.1);
  }
}

}  // namespace
}  // namespace freeride
