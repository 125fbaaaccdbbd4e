// runtime.kernels = "auto"'s classifier and multi-tensor optimizer kernels against the
// reference kernels they replace (kernels.h), on the tiny configs' shapes and GPT-2 124M's, fp32
// and bf16: the fused classifier's loss and logits gradient, the one-launch gradient norm, the
// one-launch AdamW bit for bit; bitwise-identical reruns; and whole chunks over 10 steps of two
// micro-batches each, auto against reference (beta = 0 weight products included). Under
// emulation (tests/gpu/emulated.h) GPT-2 124M's shapes are left to real GPUs: the classifier
// runs its 128-row shapes, the multi-tensor kernels a smaller layout whose tensors also span
// several chunks, 4 of the ten steps the tiny model only.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"
#include "models/cuda/classifier.h"
#include "models/cuda/cuda_stage_model.h"
#include "models/cuda/kernels.h"
#include "models/cuda/multi_tensor.h"
#include "models/device_reductions.h"
#include "models/gpt2_config.h"
#include "tests/gpu/emulated.h"
#include "tests/gpu/relative_error.h"

namespace freeride {
namespace {

using cuda::bf16;
using testing::RelativeError;

template <typename T>
class Device {
 public:
  explicit Device(int64_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p_), std::max<int64_t>(n, 1) * sizeof(T)),
              cudaSuccess);
  }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  ~Device() { cudaFree(p_); }
  void Put(const std::vector<T>& v) {
    EXPECT_EQ(cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> Get() const {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<T> v(n_);
    EXPECT_EQ(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  T* get() { return p_; }

 private:
  T* p_ = nullptr;
  int64_t n_;
};

template <typename T>
std::vector<float> Floats(const std::vector<T>& v) {
  return std::vector<float>(v.begin(), v.end());
}

template <typename T>
bool BitwiseEqual(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// N rows, V real columns of Vp: the tiny CUDA test model (200 of 256), tiny_cpu.toml's
// micro-batch (2 × 64 rows of GPT-2's vocabulary), GPT-2 124M at B 8, T 1024.
struct ClassifierShape {
  int64_t N, V, Vp;
};
const std::vector<ClassifierShape> kClassifierShapes = {
    {128, 200, 256}, {128, 50257, 50304}, {8192, 50257, 50304}};

template <typename T>
class FusedClassifierTest : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(FusedClassifierTest, ElementTypes);

TYPED_TEST(FusedClassifierTest, LossAndGradientMatchTheReferenceKernels) {
  using T = TypeParam;
  const std::vector<ClassifierShape> shapes = testing::ShapesToRun(
      kClassifierShapes, [](const ClassifierShape& sh) { return sh.N <= 128; },
      [](const ClassifierShape& sh) {
        return "N " + std::to_string(sh.N) + " V " + std::to_string(sh.V) + " of " +
               std::to_string(sh.Vp);
      });
  for (const ClassifierShape& sh : shapes) {
    SCOPED_TRACE(::testing::Message() << "N " << sh.N << ", V " << sh.V);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    std::vector<T> logits(sh.N * sh.Vp);
    for (T& x : logits) x = static_cast<T>(normal(rng));
    std::vector<int32_t> targets(sh.N);
    for (int32_t& t : targets) t = static_cast<int32_t>(rng() % sh.V);
    const float scale = 1.0f / static_cast<float>(sh.N);
    Device<T> ref(sh.N * sh.Vp), fused(sh.N * sh.Vp), stats_only(sh.N * sh.Vp);
    Device<float> ref_loss(sh.N), ref_lse(sh.N), loss(sh.N), lse(sh.N), loss2(sh.N), lse2(sh.N);
    Device<int32_t> tgt(sh.N);
    ref.Put(logits);
    fused.Put(logits);
    stats_only.Put(logits);
    tgt.Put(targets);
    cuda::CrossEntropyForward(ref_loss.get(), ref_lse.get(), ref.get(), tgt.get(), sh.N, sh.V,
                              sh.Vp, nullptr);
    cuda::CrossEntropyBackward(ref.get(), ref_lse.get(), tgt.get(), scale, sh.N, sh.V, sh.Vp,
                               nullptr);
    cuda::FusedClassifier(loss.get(), lse.get(), fused.get(), tgt.get(), scale, true, sh.N, sh.V,
                          sh.Vp, nullptr);
    cuda::FusedClassifier(loss2.get(), lse2.get(), stats_only.get(), tgt.get(), scale, false, sh.N,
                          sh.V, sh.Vp, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_LT(RelativeError(loss.Get(), ref_loss.Get()), 1e-5);
    EXPECT_LT(RelativeError(lse.Get(), ref_lse.Get()), 1e-5);
    // The gradient rounds to T at the end: one bf16 ulp of the largest apart at most.
    EXPECT_LT(RelativeError(Floats(fused.Get()), Floats(ref.Get())),
              (std::is_same_v<T, float> ? 1e-5 : 1e-2));
    // Without the gradient: the same statistics, the logits untouched.
    EXPECT_TRUE(BitwiseEqual(loss2.Get(), loss.Get()));
    EXPECT_TRUE(BitwiseEqual(lse2.Get(), lse.Get()));
    EXPECT_TRUE(BitwiseEqual(stats_only.Get(), logits));
    // Again: the same bits.
    Device<T> again(sh.N * sh.Vp);
    again.Put(logits);
    cuda::FusedClassifier(loss2.get(), lse2.get(), again.get(), tgt.get(), scale, true, sh.N, sh.V,
                          sh.Vp, nullptr);
    EXPECT_TRUE(BitwiseEqual(again.Get(), fused.Get()));
    EXPECT_TRUE(BitwiseEqual(loss2.Get(), loss.Get()));
  }
}

// Stages: the tiny CUDA test model whole, GPT-2 124M whole and as the head-only last of two
// stages (its tied wte stepped, not counted). Under emulation a 2-layer C 192 model with a
// vocabulary of 1100 (padded to 1152) stands in for GPT-2, whole and head-only: its wte, qkv
// and MLP weights span several chunks with a partial last one, as GPT-2's do.
struct Chunk {
  std::string name;
  GPT2Config config;
  StageSpec stage;
};
std::vector<Chunk> Chunks() {
  const GPT2Config tiny = *MakeGPT2Config(2, 4, 64, 32, 200);
  const GPT2Config gpt2 = *MakeGPT2Config(12, 12, 768, 1024, 50257);
  const GPT2Config small = *MakeGPT2Config(2, 3, 192, 64, 1100);
  const Chunk tiny_whole{"tiny (C 64, V 200) whole", tiny, WholeModel(tiny)};
  return testing::EmulatedInstead<Chunk>(
      {tiny_whole, {"GPT-2 124M whole", gpt2, WholeModel(gpt2)},
       {"GPT-2 124M layers [6, 12) + head", gpt2, {6, 12, false, true}}},
      {tiny_whole, {"2 layers C 192 V 1100 whole", small, WholeModel(small)},
       {"2 layers C 192 V 1100, layer [1, 2) + head", small, {1, 2, false, true}}},
      [](const Chunk& c) { return c.name; });
}

// The table on the device, as CudaStage lays it out in its planned buffer.
struct DeviceTable {
  explicit DeviceTable(const cuda::MultiTensorTable& t)
      : bytes(cuda::TableBytes(static_cast<int64_t>(t.chunks.size()), t.units())) {
    const int64_t n = static_cast<int64_t>(t.chunks.size());
    std::vector<char> host(bytes);
    std::memcpy(host.data(), t.chunks.data(), n * sizeof(cuda::TensorChunk));
    std::memcpy(host.data() + cuda::UnitBeginOffsetBytes(n), t.unit_begin.data(),
                t.unit_begin.size() * 4);
    mem.Put(host);
    chunks = reinterpret_cast<const cuda::TensorChunk*>(mem.get());
    unit_begin = reinterpret_cast<const int32_t*>(mem.get() + cuda::UnitBeginOffsetBytes(n));
  }
  int64_t bytes;
  Device<char> mem{bytes};
  const cuda::TensorChunk* chunks = nullptr;
  const int32_t* unit_begin = nullptr;
};

std::vector<float> RandomFloats(int64_t n, uint32_t seed, float sigma, bool positive = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = positive ? std::abs(normal(rng)) : normal(rng);
  return v;
}

TEST(MultiTensorTest, GradSquaresByUnitMatchTheReferenceAndRepeatBitwise) {
  for (const Chunk& c : Chunks()) {
    const ParamLayout layout = MakeParamLayout(c.config, c.stage);
    const cuda::MultiTensorTable t = cuda::MakeMultiTensorTable(layout);
    const std::vector<float> g = RandomFloats(layout.total, 3, 1e-3f);
    Device<float> grads(layout.total);
    grads.Put(g);
    DeviceTable table(t);
    const int64_t n = static_cast<int64_t>(t.chunks.size());
    Device<double> partials(n), units(t.units()), ref(t.units()), ref_partials(kReduceBlocks);
    cuda::MultiTensorGradSquares(units.get(), partials.get(), grads.get(), table.chunks,
                                 table.unit_begin, t.counted_chunks(), t.units(), nullptr);
    // The reference: SumOfSquares over each counted chunk in turn, accumulated per unit.
    for (int64_t u = 0; u < t.units(); ++u) {
      for (int32_t k = t.unit_begin[u]; k < t.unit_begin[u + 1]; ++k) {
        cuda::SumOfSquares(ref.get() + u, grads.get() + t.chunks[k].offset, t.chunks[k].elements,
                           k != t.unit_begin[u], ref_partials.get(), nullptr);
      }
    }
    const std::vector<double> got = units.Get(), want = ref.Get();
    for (int64_t u = 0; u < t.units(); ++u)
      EXPECT_NEAR(got[u], want[u], 1e-12 * want[u]) << "unit " << u;
    // The counted units hold every counted element once: Σ units = Σ g² over them (host fp64,
    // Neumaier-compensated: each square is exact in fp64, and a plain running sum of GPT-2
    // 124M's ~124M squares is itself off by ~3e-12 relative, more than the tolerance).
    double host = 0, compensation = 0;
    for (int32_t k = 0; k < t.counted_chunks(); ++k) {
      for (int32_t i = 0; i < t.chunks[k].elements; ++i) {
        const double x = double(g[t.chunks[k].offset + i]) * g[t.chunks[k].offset + i];
        const double s = host + x;
        compensation += std::abs(host) >= std::abs(x) ? (host - s) + x : (x - s) + host;
        host = s;
      }
    }
    host += compensation;
    double sum = 0;
    for (double u : got) sum += u;
    EXPECT_NEAR(sum, host, 1e-12 * host);
    cuda::MultiTensorGradSquares(units.get(), partials.get(), grads.get(), table.chunks,
                                 table.unit_begin, t.counted_chunks(), t.units(), nullptr);
    EXPECT_TRUE(BitwiseEqual(units.Get(), got));
  }
}

TEST(MultiTensorTest, AdamWIsBitwiseThePerTensorKernel) {
  for (const Chunk& c : Chunks()) {
    const ParamLayout layout = MakeParamLayout(c.config, c.stage);
    const cuda::MultiTensorTable t = cuda::MakeMultiTensorTable(layout);
    const int64_t P = layout.total;
    const std::vector<float> p0 = RandomFloats(P, 5, 0.02f), g = RandomFloats(P, 6, 1e-3f),
                             m0 = RandomFloats(P, 7, 1e-4f), v0 = RandomFloats(P, 8, 1e-6f, true);
    for (bool bf16_copy : {false, true}) {
      Device<float> p[2] = {Device<float>(P), Device<float>(P)},
                    m[2] = {Device<float>(P), Device<float>(P)},
                    v[2] = {Device<float>(P), Device<float>(P)};
      Device<bf16> compute[2] = {Device<bf16>(P), Device<bf16>(P)};
      Device<float> grads(P);
      grads.Put(g);
      for (int k = 0; k < 2; ++k) {
        p[k].Put(p0);
        m[k].Put(m0);
        v[k].Put(v0);
      }
      cuda::AdamWArgs a{6e-4f,
                        0.9f,
                        0.95f,
                        1e-8f,
                        0.1f,
                        0.7f,
                        1.0f - 0.9f * 0.9f * 0.9f,
                        1.0f - 0.95f * 0.95f * 0.95f};
      for (const TensorSlot& s : layout.slots) {
        if (!s.present) continue;
        cuda::AdamWArgs per = a;
        per.weight_decay = IsDecayed(s.tensor) ? a.weight_decay : 0.0f;
        cuda::AdamW(p[0].get() + s.offset, bf16_copy ? compute[0].get() + s.offset : nullptr,
                    grads.get() + s.offset, m[0].get() + s.offset, v[0].get() + s.offset,
                    s.elements, per, nullptr);
      }
      DeviceTable table(t);
      cuda::MultiTensorAdamW(p[1].get(), bf16_copy ? compute[1].get() : nullptr, grads.get(),
                             m[1].get(), v[1].get(), table.chunks,
                             static_cast<int64_t>(t.chunks.size()), a, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_TRUE(BitwiseEqual(p[1].Get(), p[0].Get()));
      EXPECT_TRUE(BitwiseEqual(m[1].Get(), m[0].Get()));
      EXPECT_TRUE(BitwiseEqual(v[1].Get(), v[0].Get()));
      if (bf16_copy) {
        EXPECT_TRUE(BitwiseEqual(compute[1].Get(), compute[0].Get()));
      }
      EXPECT_FALSE(BitwiseEqual(p[1].Get(), p0));  // it did step
    }
  }
}

// ---- whole chunks: auto against reference ------------------------------------------------

struct TrainRun {
  std::vector<double> losses, first_units;
  std::vector<float> params, first_grads;
};

// `steps` optimizer steps of two micro-batches each, as the pipeline executor drives a chunk
// (ForwardTraining), the loss scale 1 / tokens of the step, AdamW at learning rate `lr`.
TrainRun Train(const GPT2Config& config, int64_t B, int64_t T, CudaPrecision precision,
               cuda::KernelMode kernels, int steps, double lr) {
  CudaStageOptions options;
  options.precision = precision;
  options.kernels = kernels;
  auto made = CudaStageModel::Create(config, WholeModel(config), B, T, 1, options);
  EXPECT_TRUE(made.ok()) << made.status();
  TrainRun run;
  if (!made.ok()) return run;
  CudaStageModel& model = **made;
  EXPECT_TRUE(model.InitRandom(21).ok());
  std::mt19937 rng(4);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  const float scale = 1.0f / static_cast<float>(2 * B * T);
  for (int step = 1; step <= steps; ++step) {
    EXPECT_TRUE(model.ZeroGrads().ok());
    double loss = 0;
    for (int mb = 0; mb < 2; ++mb) {
      for (int64_t i = 0; i < B * T; ++i) {
        // From the first 256 ids at most: a mapping over GPT-2's whole vocabulary is not
        // learnable in 10 steps (the loss rose 10.98 → 11.02 on an H100, 2026-11-26).
        tokens[i] = static_cast<int32_t>(rng() % std::min<int64_t>(config.vocab_size, 256));
        targets[i] = static_cast<int32_t>((tokens[i] * 7 + 3) % config.vocab_size);  // learnable
      }
      EXPECT_TRUE(model.SetTokens(0, tokens.data()).ok());
      EXPECT_TRUE(model.SetTargets(0, targets.data()).ok());
      absl::StatusOr<double> l = model.ForwardTraining(0, scale);
      EXPECT_TRUE(l.ok()) << l.status();
      loss += l.ok() ? *l / 2 : NAN;
      EXPECT_TRUE(model.BackwardInput(0, scale).ok());
      EXPECT_TRUE(model.BackwardWeight(0).ok());
    }
    EXPECT_TRUE(model.FoldHeadWteGrad().ok());
    absl::StatusOr<std::vector<double>> units = model.GradSquaresByUnit();
    EXPECT_TRUE(units.ok()) << units.status();
    if (step == 1 && units.ok()) {
      run.first_units = *units;
      absl::StatusOr<float*> g = model.HostGrads(0, model.num_params());
      EXPECT_TRUE(g.ok());
      if (g.ok()) run.first_grads.assign(*g, *g + model.num_params());
    }
    AdamWStep adam;
    adam.lr = static_cast<float>(lr);
    adam.weight_decay = 0.1;
    adam.step = step;
    EXPECT_TRUE(model.ApplyAdamW(adam).ok());
    run.losses.push_back(loss);
  }
  run.params.resize(model.num_params());
  EXPECT_TRUE(model.GetParams(run.params.data()).ok());
  return run;
}

// The parameters with every layer's key bias (the middle third of the qkv bias) set to 0.
std::vector<float> WithoutKeyBias(const GPT2Config& config, std::vector<float> params) {
  const ParamLayout layout = MakeParamLayout(config, WholeModel(config));
  const int64_t C = config.n_embd;
  for (int64_t l = 0; l < config.n_layer; ++l) {
    const int64_t begin = layout.slot(ParamTensor::kQkvB).offset + l * 3 * C + C;
    std::fill(params.begin() + begin, params.begin() + begin + C, 0.0f);
  }
  return params;
}

class KernelModeTest : public ::testing::TestWithParam<CudaPrecision> {
 protected:
  bool bf16() const { return GetParam() == CudaPrecision::kBf16; }
  void Compare(const GPT2Config& config, int64_t B, int64_t T, double lr) {
    const int steps = testing::StepsToRun(10, 4);
    const TrainRun a = Train(config, B, T, GetParam(), cuda::KernelMode::kAuto, steps, lr);
    const TrainRun r = Train(config, B, T, GetParam(), cuda::KernelMode::kReference, steps, lr);
    ASSERT_EQ(a.losses.size(), r.losses.size());
    for (size_t s = 0; s < r.losses.size(); ++s) {
      std::printf("step %zu loss auto %.9f reference %.9f\n", s + 1, a.losses[s], r.losses[s]);
      EXPECT_NEAR(a.losses[s], r.losses[s], (bf16() ? 1e-2 : 1e-5) * r.losses[s])
          << "step " << s + 1;
    }
    EXPECT_LT(r.losses.back(), r.losses.front());  // it learns
    ASSERT_EQ(a.first_units.size(), r.first_units.size());
    for (size_t u = 0; u < r.first_units.size(); ++u) {
      EXPECT_NEAR(a.first_units[u], r.first_units[u], (bf16() ? 2e-2 : 1e-5) * r.first_units[u])
          << "unit " << u;
    }
    EXPECT_LT(RelativeError(a.first_grads, r.first_grads), bf16() ? 2e-2 : 1e-5);
    // The key bias's gradient is 0 but for rounding (softmax ignores a constant per row), so
    // its noise, summed in another order, can move AdamW's update by up to ±lr a step: those
    // parameters are left out of the comparison. Other weights whose gradients cancel to
    // within rounding (1e-9 against a typical 1e-3) do the same on a smaller scale, so fp32
    // parameters after 10 steps agree to 5e-4, not to the first step's 1e-5: measured 1.5e-5
    // (tiny) and 1.3e-4 (GPT-2) on an H100, 4.1e-5 (2 layers, C 128) under emulation.
    EXPECT_LT(RelativeError(WithoutKeyBias(config, a.params), WithoutKeyBias(config, r.params)),
              bf16() ? 2e-2 : 5e-4);
    const TrainRun again = Train(config, B, T, GetParam(), cuda::KernelMode::kAuto, 3, lr);
    for (size_t s = 0; s < again.losses.size(); ++s) EXPECT_EQ(again.losses[s], a.losses[s]);
  }
};

TEST_P(KernelModeTest, TinyTenStepsAutoFollowReference) {
  testing::PrintShapes({"tiny: 2 layers C 64 (hs 16) V 200, B 4 T 32"});
  Compare(*MakeGPT2Config(2, 4, 64, 32, 200), 4, 32, 1e-3);
}

// Under emulation only the tiny model's steps run (TinyTenStepsAutoFollowReference: 4 of its
// 10 steps, about 12 s a precision there). A smaller stand-in for GPT-2 (2 layers, C 128, hs 64,
// V 1000) was tried: its losses agree to 1e-8, but a few weights whose gradients cancel to
// ~1e-9 (typical 1e-3) move by AdamW's ±lr on rounding noise, past the fp32 1e-5 on parameters,
// as the key bias does.
TEST_P(KernelModeTest, Gpt2TenStepsAutoFollowReference) {
  constexpr char kShape[] = "GPT-2 124M (12 layers C 768 V 50257), B 4 T 1024";
  if (testing::kEmulated) {
    testing::PrintShapes({}, {kShape});
    GTEST_SKIP() << "emulated build: " << kShape
                 << " is left to real GPUs (minutes per step when every CUDA thread is a fiber); "
                    "TinyTenStepsAutoFollowReference runs the same comparison on the tiny model";
  }
  testing::PrintShapes({kShape});
  // At lr 1e-3 with no warm-up GPT-2 124M trains at the edge of stability (10.98 to 5.6 in
  // 10 steps, the bf16 reference itself bouncing 5.9 → 7.0 → 5.7): rounding differences then
  // grow as any perturbation does, fp32 losses agreeing to 1e-5 for 6 steps and 1.4e-3 by
  // step 10 (H100, 2026-11-26). Kernels are compared where the dynamics do not amplify them.
  Compare(*MakeGPT2Config(12, 12, 768, 1024, 50257), 4, 1024, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Precisions, KernelModeTest,
                         ::testing::Values(CudaPrecision::kFp32, CudaPrecision::kBf16),
                         [](const auto& info) {
                           return info.param == CudaPrecision::kBf16 ? "bf16" : "fp32";
                         });

// ZeroGrads leaves the weight matrices to the next products; whatever reads the gradients
// first sees them zeroed, and a ForwardTraining's gradient is checked against its backward.
TEST(KernelModeTest, DeferredZerosAndTheFusedGradientsContract) {
  testing::PrintShapes({"tiny: 2 layers C 64 V 200, B 2 T 32"});
  const GPT2Config config = *MakeGPT2Config(2, 4, 64, 32, 200);
  CudaStageOptions options;
  options.precision = CudaPrecision::kBf16;
  auto made = CudaStageModel::Create(config, WholeModel(config), 2, 32, 1, options);
  ASSERT_TRUE(made.ok()) << made.status();
  CudaStageModel& model = **made;
  ASSERT_TRUE(model.InitRandom(3).ok());
  std::vector<int32_t> tokens(64, 5);
  ASSERT_TRUE(model.SetTokens(0, tokens.data()).ok());
  ASSERT_TRUE(model.SetTargets(0, tokens.data()).ok());
  ASSERT_TRUE(model.ZeroGrads().ok());
  ASSERT_TRUE(model.ForwardTraining(0, 0.5f).ok());
  std::vector<float> logits(2 * config.padded_vocab_size);
  EXPECT_EQ(model.GetLogitsAt(0, 0, logits.data()).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(model.BackwardInput(0, 0.25f).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(model.ForwardTraining(0, 0.5f).ok());
  ASSERT_TRUE(model.BackwardInput(0, 0.5f).ok());
  ASSERT_TRUE(model.BackwardWeight(0).ok());
  absl::StatusOr<std::vector<double>> units = model.GradSquaresByUnit();
  ASSERT_TRUE(units.ok());
  EXPECT_GT((*units)[1], 0.0);
  // A step's gradients, then ZeroGrads and no backward: all zero.
  ASSERT_TRUE(model.ZeroGrads().ok());
  units = model.GradSquaresByUnit();
  ASSERT_TRUE(units.ok());
  for (double u : *units) EXPECT_EQ(u, 0.0);
  // Forward leaves the logits readable.
  ASSERT_TRUE(model.Forward(0).ok());
  EXPECT_TRUE(model.GetLogitsAt(0, 0, logits.data()).ok());
}

}  // namespace
}  // namespace freeride
