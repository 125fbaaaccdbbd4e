// Activation recomputation on the CUDA chunk (model.recompute; StageBufferIds in
// models/device_memory_plan.h says what each mode keeps): selective and full give the same
// bits as none (every gradient, loss, output and input gradient) for both families in fp32 and
// bf16, in the orders of Forward, BackwardInput and BackwardWeight the schedules use (W
// deferred past other slots' work: the zero-bubble I/W split); and the device memory a chunk
// allocates is its plan's, smaller as the mode keeps less. Every model is tiny: the emulation
// build runs them all.
#include <cuda_runtime_api.h>

#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "models/backend.h"
#include "models/cuda/cuda_stage_model.h"
#include "tests/gpu/emulated.h"

namespace freeride {
namespace {

constexpr int64_t kB = 2, kT = 8;
constexpr int kSlots = 3;

// Three layers (a stage of two holds a block whose output gradient is not the stage's), head
// size 16: the flash kernels in bf16, the reference attention in fp32.
GPT2Config TinyGpt2() { return *MakeGPT2Config(3, 2, 32, kT, 100); }
GPT2Config TinyLlama() {
  return *MakeLlamaConfig(/*n_layer=*/3, /*n_head=*/4, /*n_kv_head=*/2, /*n_embd=*/64,
                          /*max_seq_len=*/kT, /*vocab_size=*/100, /*ffn_hidden=*/96,
                          /*rope_theta=*/10000.0, /*norm_eps=*/1e-5, /*tied=*/false);
}

struct Param {
  bool llama;
  CudaPrecision precision;
  cuda::KernelMode kernels;
};
std::string Name(const ::testing::TestParamInfo<Param>& info) {
  const Param& p = info.param;
  return absl::StrFormat("%s_%s_%s", p.llama ? "llama" : "gpt2",
                         p.precision == CudaPrecision::kBf16 ? "bf16" : "fp32",
                         p.kernels == cuda::KernelMode::kAuto ? "auto" : "reference");
}
void PrintTo(const Param& p, std::ostream* os) {
  *os << Name(::testing::TestParamInfo<Param>(p, 0));
}

// One call of a slot's life: 'F', 'I' or 'W'.
struct Call {
  char op;
  int slot;
};

// What a chunk made from the same parameters and inputs: every gradient, and per slot its
// loss, output activations and input gradient (messages' bytes).
struct Outcome {
  std::vector<float> grads;
  std::vector<double> losses;
  std::vector<std::vector<char>> outputs, input_grads;
};

class CudaRecomputeTest : public ::testing::TestWithParam<Param> {
 protected:
  GPT2Config config() const { return GetParam().llama ? TinyLlama() : TinyGpt2(); }
  std::string Shape() const {
    return GetParam().llama ? "llama: 3 layers C 64 (4 heads, 2 kv heads) F 96 V 100, B 2 T 8"
                            : "gpt2: 3 layers C 32 (2 heads) V 100, B 2 T 8";
  }
  std::unique_ptr<CudaStageModel> Chunk(const StageSpec& spec, Recompute mode) const {
    CudaStageOptions options;
    options.precision = GetParam().precision;
    options.kernels = GetParam().kernels;
    options.recompute = mode;
    auto m = CudaStageModel::Create(config(), spec, kB, kT, kSlots, options);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *std::move(m) : nullptr;
  }
  Outcome Run(const StageSpec& spec, Recompute mode, const std::vector<Call>& calls) const;
};

Outcome CudaRecomputeTest::Run(const StageSpec& spec, Recompute mode,
                               const std::vector<Call>& calls) const {
  Outcome out;
  std::unique_ptr<CudaStageModel> m = Chunk(spec, mode);
  if (m == nullptr) return out;
  EXPECT_NE(m->Describe().find(mode == Recompute::kNone ? "" : RecomputeName(mode)),
            std::string::npos);
  EXPECT_TRUE(m->InitRandom(11).ok());
  EXPECT_TRUE(m->ZeroGrads().ok());
  const int64_t BT = kB * kT, n = m->MessageElements();
  const MessageType type = m->message_type();
  auto message = [&](std::mt19937& rng, float scale) {
    std::normal_distribution<float> normal(0, scale);
    std::vector<float> values(n);
    for (float& v : values) v = normal(rng);
    std::vector<char> bytes(m->MessageBytes());
    ToMessage(type, values.data(), n, bytes.data());
    return bytes;
  };
  std::mt19937 rng(5);
  std::vector<std::vector<char>> inputs(kSlots), output_grads(kSlots);
  for (int s = 0; s < kSlots; ++s) {
    std::vector<int32_t> tokens(BT), targets(BT);
    for (int64_t i = 0; i < BT; ++i) {
      tokens[i] = static_cast<int32_t>(rng() % config().vocab_size);
      targets[i] = static_cast<int32_t>(rng() % config().vocab_size);
    }
    if (spec.has_embedding) {
      EXPECT_TRUE(m->SetTokens(s, tokens.data()).ok());
    }
    if (spec.has_head) {
      EXPECT_TRUE(m->SetTargets(s, targets.data()).ok());
    }
    inputs[s] = message(rng, 1.0f);
    if (!spec.has_embedding) {
      EXPECT_TRUE(m->SetInputActivations(s, inputs[s].data()).ok());
    }
    output_grads[s] = message(rng, 0.01f);
  }
  EXPECT_TRUE(m->FinishMessageReads().ok());
  out.losses.assign(kSlots, 0);
  out.outputs.assign(kSlots, std::vector<char>(m->MessageBytes()));
  out.input_grads.assign(kSlots, std::vector<char>(m->MessageBytes()));
  for (const Call& c : calls) {
    switch (c.op) {
      case 'F': {
        absl::StatusOr<double> loss = m->Forward(c.slot);
        EXPECT_TRUE(loss.ok()) << loss.status();
        out.losses[c.slot] = loss.value_or(0);
        if (!spec.has_head) {
          EXPECT_TRUE(m->GetOutputActivations(c.slot, out.outputs[c.slot].data()).ok());
          // The next stage's gradient arrives before this slot's BackwardInput.
          EXPECT_TRUE(m->SetOutputGrad(c.slot, output_grads[c.slot].data()).ok());
          EXPECT_TRUE(m->FinishMessageReads().ok());
        }
        break;
      }
      case 'I':
        EXPECT_TRUE(m->BackwardInput(c.slot, 1.0f / (kSlots * BT)).ok());
        EXPECT_TRUE(m->GetInputGrad(c.slot, out.input_grads[c.slot].data()).ok());
        break;
      case 'W':
        EXPECT_TRUE(m->BackwardWeight(c.slot).ok());
        break;
    }
  }
  EXPECT_TRUE(m->FoldHeadWteGrad().ok());
  absl::StatusOr<float*> grads = m->HostGrads(0, m->num_params());
  EXPECT_TRUE(grads.ok()) << grads.status();
  if (grads.ok()) out.grads.assign(*grads, *grads + m->num_params());
  return out;
}

template <typename V>
bool SameBits(const std::vector<V>& a, const std::vector<V>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(V)) == 0;
}

TEST_P(CudaRecomputeTest, EveryModeGivesTheSameBitsInEveryScheduleOrder) {
  testing::PrintShapes({Shape()});
  const GPT2Config cfg = config();
  const std::vector<std::pair<const char*, StageSpec>> stages = {
      {"whole model", WholeModel(cfg)},
      {"middle stage", {1, 3, false, false}},
  };
  const std::vector<std::pair<const char*, std::vector<Call>>> orders = {
      // B = I then W at once (GPipe, 1F1B, interleaved).
      {"1f1b",
       {{'F', 0}, {'F', 1}, {'I', 0}, {'W', 0}, {'F', 2}, {'I', 1}, {'W', 1}, {'I', 2}, {'W', 2}}},
      // Zero-bubble: slot 0's W after another slot's forward, slot 2's at once after its I,
      // slot 1's deferred past slot 2's I and W.
      {"zero bubble",
       {{'F', 0}, {'F', 1}, {'I', 0}, {'F', 2}, {'W', 0}, {'I', 1}, {'I', 2}, {'W', 2}, {'W', 1}}},
  };
  for (const auto& [stage_name, spec] : stages) {
    for (const auto& [order_name, calls] : orders) {
      const Outcome none = Run(spec, Recompute::kNone, calls);
      int nonzero = 0;  // the comparison below compares something
      for (float g : none.grads) nonzero += g != 0;
      EXPECT_GT(nonzero, static_cast<int>(none.grads.size()) / 2) << stage_name;
      for (Recompute mode : {Recompute::kSelective, Recompute::kFull}) {
        SCOPED_TRACE(
            absl::StrFormat("%s, %s, recompute %s", stage_name, order_name, RecomputeName(mode)));
        const Outcome got = Run(spec, mode, calls);
        EXPECT_TRUE(SameBits(got.grads, none.grads));
        EXPECT_EQ(got.losses, none.losses);
        for (int s = 0; s < kSlots; ++s) {
          EXPECT_TRUE(SameBits(got.outputs[s], none.outputs[s])) << "slot " << s;
          EXPECT_TRUE(SameBits(got.input_grads[s], none.input_grads[s])) << "slot " << s;
        }
      }
    }
  }
}

// The device memory a chunk takes is its plan's (the emulated device counts what is
// allocated; a GPU's free memory also moves with the context and libraries, so there the
// chunk's own count), and each mode's plan keeps less than the one before.
TEST_P(CudaRecomputeTest, TheChunkAllocatesItsPlanWhichShrinksWithTheMode) {
  testing::PrintShapes({Shape()});
  const GPT2Config cfg = config();
  const StageSpec spec = WholeModel(cfg);
  const int bytes = GetParam().precision == CudaPrecision::kBf16 ? 2 : 4;
  int64_t previous = 0;
  for (Recompute mode : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    SCOPED_TRACE(RecomputeName(mode));
    size_t free_before = 0, free_after = 0, total = 0;
    ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
    std::unique_ptr<CudaStageModel> m = Chunk(spec, mode);
    ASSERT_NE(m, nullptr);
    ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
    MemoryPlan plan;
    PlanStageMemory(cfg, spec, kB, kT, kSlots, bytes, &plan, true, cuda::AttentionMode::kAuto,
                    mode);
    EXPECT_EQ(m->memory_plan().TotalBytes(), plan.TotalBytes());
    EXPECT_EQ(m->DeviceBytes(), plan.TotalBytes());
    if (testing::kEmulated) {
      EXPECT_EQ(static_cast<int64_t>(free_before - free_after), plan.TotalBytes());
    }
    const int64_t activations = plan.PhaseBytes(MemoryPhase::kActivations);
    if (mode != Recompute::kNone) {
      EXPECT_LT(activations, previous);
    }
    previous = activations;
  }
}

// The trainer's way in: a CUDA backend asked to recompute makes a chunk that does.
TEST_P(CudaRecomputeTest, TheBackendMakesARecomputingChunk) {
  testing::PrintShapes({Shape()});
  BackendOptions options;
  options.device = "cuda";
  options.precision = GetParam().precision == CudaPrecision::kBf16 ? "bf16" : "fp32";
  options.recompute = Recompute::kFull;
  absl::StatusOr<std::unique_ptr<StageModel>> chunk =
      MakeStageModel(options, config(), WholeModel(config()), kB, kT, kSlots);
  ASSERT_TRUE(chunk.ok()) << chunk.status();
  EXPECT_NE((*chunk)->Describe().find("recompute full"), std::string::npos) << (*chunk)->Describe();
}

INSTANTIATE_TEST_SUITE_P(
    FamiliesAndPrecisions, CudaRecomputeTest,
    ::testing::Values(Param{false, CudaPrecision::kFp32, cuda::KernelMode::kAuto},
                      Param{false, CudaPrecision::kFp32, cuda::KernelMode::kReference},
                      Param{false, CudaPrecision::kBf16, cuda::KernelMode::kAuto},
                      Param{true, CudaPrecision::kFp32, cuda::KernelMode::kAuto},
                      Param{true, CudaPrecision::kBf16, cuda::KernelMode::kAuto}),
    Name);

}  // namespace
}  // namespace freeride
