#include "trainer/emulation.h"

#include <algorithm>
#include <random>

#include "core/status.h"
#include "core/timer.h"

namespace freeride {

absl::StatusOr<pipeline::CostModel> CalibrateStageCosts(
    const BackendOptions& backend, const GPT2Config& config, const std::vector<StageSpec>& stages,
    int pp, pipeline::Placement placement, int64_t micro_batch, int64_t seq_len, double link_gbs,
    uint64_t seed, const std::vector<Recompute>& recompute) {
  pipeline::CostModel cost;
  cost.stages.assign(pp, pipeline::StageCost{0, 0, 0});
  const int64_t rows = micro_batch * seq_len, floats = rows * config.n_embd;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  std::vector<int32_t> tokens(rows), targets(rows);
  std::vector<float> input(floats), output_grad(floats);
  const MessageType messages = MessageTypeOf(backend);
  for (size_t v = 0; v < stages.size(); ++v) {
    const StageSpec& spec = stages[v];
    BackendOptions options = backend;
    if (!recompute.empty()) {
      options.recompute = recompute[pipeline::StageOfVirtual(placement, pp, static_cast<int>(v))];
    }
    // On the device that trains: a stage's cost on the CPU says nothing about it on a GPU.
    absl::StatusOr<std::unique_ptr<StageModel>> stage =
        MakeStageModel(options, config, spec, micro_batch, seq_len, 1);
    if (!stage.ok()) return stage.status();
    StageModel& s = **stage;
    FR_RETURN_IF_ERROR(s.InitRandom(seed));
    for (int64_t i = 0; i < rows; ++i) {
      tokens[i] = static_cast<int32_t>(rng() % config.vocab_size);
      targets[i] = static_cast<int32_t>(rng() % config.vocab_size);
    }
    for (int64_t i = 0; i < floats; ++i) input[i] = u(rng), output_grad[i] = u(rng) * 1e-3f;
    // As messages of the chunk's type, in its own message memory.
    FR_ASSIGN_OR_RETURN(MessageBuffer input_message, s.AllocateMessageBuffer(MessageMemory::kHost));
    FR_ASSIGN_OR_RETURN(MessageBuffer grad_message, s.AllocateMessageBuffer(MessageMemory::kHost));
    ToMessage(s.message_type(), input.data(), floats, input_message.get());
    ToMessage(s.message_type(), output_grad.data(), floats, grad_message.get());
    if (spec.has_embedding) FR_RETURN_IF_ERROR(s.SetTokens(0, tokens.data()));
    if (spec.has_head) FR_RETURN_IF_ERROR(s.SetTargets(0, targets.data()));
    if (!spec.has_embedding) FR_RETURN_IF_ERROR(s.SetInputActivations(0, input_message.get()));
    // Each pass as a training step runs it (the forward knowing its backward's loss scale:
    // CUDA's fused classifier then makes the logits gradient in F), timed until the device has
    // finished it: a device chunk's compute calls return once their work is queued.
    const float scale = 1.0f / static_cast<float>(rows);
    double f = 1e30, b = 1e30, w = 1e30;
    for (int rep = 0; rep < 4; ++rep) {  // the first run warms up; the fastest of the rest
      FR_RETURN_IF_ERROR(s.Drain());
      Timer t;
      FR_RETURN_IF_ERROR(s.ForwardKeepingLoss(0, scale));
      FR_RETURN_IF_ERROR(s.Drain());
      const double tf = t.ElapsedSeconds();
      if (!spec.has_head) FR_RETURN_IF_ERROR(s.SetOutputGrad(0, grad_message.get()));
      FR_RETURN_IF_ERROR(s.Drain());
      Timer tb;
      FR_RETURN_IF_ERROR(s.BackwardInput(0, scale));
      FR_RETURN_IF_ERROR(s.Drain());
      const double tbi = tb.ElapsedSeconds();
      Timer tw;
      FR_RETURN_IF_ERROR(s.BackwardWeight(0));
      FR_RETURN_IF_ERROR(s.Drain());
      const double tww = tw.ElapsedSeconds();
      if (rep > 0) f = std::min(f, tf), b = std::min(b, tbi), w = std::min(w, tww);
    }
    FR_RETURN_IF_ERROR(s.TakeLosses().status());
    pipeline::StageCost& stage_cost =
        cost.stages[pipeline::StageOfVirtual(placement, pp, static_cast<int>(v))];
    stage_cost.f += f * 1e3;
    stage_cost.b += b * 1e3;
    stage_cost.w += w * 1e3;
    if (stages.size() > static_cast<size_t>(pp)) cost.chunks.push_back({f * 1e3, b * 1e3, w * 1e3});
    FR_RETURN_IF_ERROR(s.FinishMessageReads());  // before the messages are freed
  }
  cost.comm = static_cast<double>(floats) * MessageTypeBytes(messages) / (link_gbs * 1e9) * 1e3;
  return cost;
}

absl::StatusOr<PartCosts> MeasurePartCosts(const BackendOptions& backend,
                                           const GPT2Config& config, int64_t micro_batch,
                                           int64_t seq_len, uint64_t seed) {
  const std::vector<StageSpec> probes = {{0, 1, true, false}, {0, 1, false, false},
                                         {0, 1, false, true}};
  absl::StatusOr<pipeline::CostModel> cost =
      CalibrateStageCosts(backend, config, probes, 3, pipeline::Placement::kLoop, micro_batch,
                          seq_len, 1.0, seed);
  if (!cost.ok()) return cost.status();
  auto total = [&](int s) {
    const pipeline::StageCost& c = cost->stages[s];
    return c.f + c.b + c.w;
  };
  PartCosts parts;
  parts.block = total(1);
  parts.embedding = std::max(0.0, total(0) - parts.block);
  parts.head = std::max(0.0, total(2) - parts.block);
  return parts;
}

PartCosts SimulatedPartCosts(const GPT2Config& config, int64_t micro_batch, int64_t seq_len) {
  const PartCosts flops = FlopPartCosts(config, seq_len);
  const double ms_per_flop =
      static_cast<double>(micro_batch * seq_len) / kSimulatedFlopsPerSecond * 1e3;
  return PartCosts{flops.embedding * ms_per_flop, flops.block * ms_per_flop,
                   flops.head * ms_per_flop};
}

absl::StatusOr<double> MeasureOptimizerMsPerParam(const BackendOptions& backend,
                                                  const GPT2Config& config, int64_t micro_batch,
                                                  int64_t seq_len, uint64_t seed) {
  // A block and the head: the vocabulary matrix makes the update's state as much larger than
  // the caches as a real rank's is. One block alone fits a small model's state in cache and
  // times the update 6x too fast (0.55 against 3.5 ns per parameter for the tiny model).
  const StageSpec probe{0, 1, false, true};
  FR_ASSIGN_OR_RETURN(std::unique_ptr<StageModel> stage,
                      MakeStageModel(backend, config, probe, micro_batch, seq_len, 1));
  FR_RETURN_IF_ERROR(stage->InitRandom(seed));
  AdamWStep step;
  step.lr = 1e-4;
  step.weight_decay = 0.1;
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {  // the first run warms up; the fastest of the rest
    step.step = rep + 1;
    // What OPTIMIZER computes: the gradient norm's squares, then the update.
    Timer t;
    FR_RETURN_IF_ERROR(stage->GradSquaresByUnit().status());
    FR_RETURN_IF_ERROR(stage->ApplyAdamW(step));
    if (rep > 0) best = std::min(best, t.ElapsedSeconds());
  }
  return best * 1e3 / static_cast<double>(MakeParamLayout(config, probe).total);
}

}  // namespace freeride
