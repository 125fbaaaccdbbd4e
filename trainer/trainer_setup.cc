#include "trainer/trainer_setup.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "core/logging.h"
#include "core/status.h"
#include "models/checkpoint_verify.h"
#include "models/llmc_checkpoint.h"
#include "pipeline/grad_buckets.h"
#include "trainer/emulation.h"
#include "trainer/trainer.h"

namespace freeride {

absl::StatusOr<pipeline::RankLayout> RankPhase(const Config& config,
                                               const pipeline::Transport* transport) {
  const bool emulate = config.runtime.emulate_peers;
  if (emulate) {
    if (transport != nullptr) {
      return absl::InvalidArgumentError(
          "runtime.emulate_peers runs one process that emulates the other stages: launch it "
          "without mpirun");
    }
    if (config.parallel.dp != 1 || config.runtime.emulated_stage >= config.parallel.pp) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "runtime.emulate_peers needs parallel.dp = 1 (is %d) and runtime.emulated_stage below "
          "parallel.pp (%d, pp = %d)",
          config.parallel.dp, config.runtime.emulated_stage, config.parallel.pp));
    }
  } else {
    FR_RETURN_IF_ERROR(CheckWorldSize(config, transport == nullptr ? 1 : transport->size()));
  }
  pipeline::RankLayout layout;
  layout.pp = static_cast<int>(config.parallel.pp);
  layout.dp = static_cast<int>(config.parallel.dp);
  const int rank = transport == nullptr ? 0 : transport->rank();
  layout.stage = emulate ? static_cast<int>(config.runtime.emulated_stage) : rank % layout.pp;
  layout.replica = emulate ? 0 : rank / layout.pp;
  return layout;
}

absl::StatusOr<GPT2Config> ModelPhase(const Config& config) {
  FR_ASSIGN_OR_RETURN(GPT2Config model, ResolveModelConfig(config));
  if (config.train.seq_len > model.max_seq_len) {
    return absl::InvalidArgumentError(
        absl::StrFormat("train.seq_len = %d exceeds the model's max_seq_len = %d",
                        config.train.seq_len, model.max_seq_len));
  }
  return model;
}

absl::StatusOr<std::optional<PartCosts>> PartCostsPhase(
    const Config& config, const GPT2Config& model, const BackendOptions& backend,
    const pipeline::RankLayout& layout, pipeline::Transport* transport, bool simulated) {
  if (!NeedsPartCosts(config)) return std::nullopt;
  const int64_t micro_batch = config.train.batch_size / config.train.microbatches;
  const int64_t T = config.train.seq_len;
  if (simulated) return SimulatedPartCosts(model, micro_batch, T);
  FR_ASSIGN_OR_RETURN(PartCosts measured,
                      MeasurePartCosts(backend, model, micro_batch, T, config.run.seed));
  if (transport == nullptr || transport->size() == 1) return measured;
  // Every rank timed its own probes: their mean, the same on all, splits the model alike.
  double sums[3] = {measured.embedding, measured.block, measured.head};
  if (absl::Status s =
          transport->AllReduceSum(sums, 3, transport->AllRanks(), config.runtime.comm_timeout_s);
      !s.ok()) {
    return absl::Status(
        s.code(), absl::StrFormat("rank %d (stage %d, replica %d) setting up, summing its "
                                  "part-cost probes with every rank's: %s",
                                  transport->rank(), layout.stage, layout.replica, s.message()));
  }
  const double n = transport->size();
  return PartCosts{sums[0] / n, sums[1] / n, sums[2] / n};
}

absl::StatusOr<PipelineSetup> PipelinePhase(const Config& config, const GPT2Config& model,
                                            const std::optional<PartCosts>& part_costs,
                                            const BackendOptions& backend,
                                            pipeline::RankLayout* layout, bool simulated,
                                            bool leader) {
  PipelineSetup out;
  FR_ASSIGN_OR_RETURN(out.plan, PlanPipeline(config, model, part_costs));
  layout->chunks = out.plan.chunks;
  if (leader) {
    FR_LOG(INFO) << "pipeline split " << out.plan.partition << ": "
                 << DescribePartition(out.plan, layout->pp);
    if (!out.plan.warning.empty()) {
      FR_LOG(WARN) << out.plan.warning;
    }
    if (!out.plan.imbalance.empty()) {
      FR_LOG(WARN) << out.plan.imbalance;
    }
  }
  const int64_t micro_batch = config.train.batch_size / config.train.microbatches;
  const int64_t T = config.train.seq_len;
  if (simulated) {
    out.compute =
        CostModelFromParts(out.plan.specs, SimulatedPartCosts(model, micro_batch, T),
                           out.plan.placement, layout->pp, RecomputedForwardShares(config, model));
    out.compute->comm = static_cast<double>(micro_batch * T * model.n_embd) *
                        MessageTypeBytes(MessageTypeOf(backend)) /
                        (config.runtime.link_bandwidth_gbs * 1e9) * 1e3;
  }
  if (config.runtime.emulate_peers) {
    // The other stages' costs, measured by running their layers here; the schedule's bubbles
    // are placed with them from the start.
    if (simulated) {
      out.cost = *out.compute;
    } else {
      FR_ASSIGN_OR_RETURN(out.cost, CalibrateStageCosts(backend, model, out.plan.specs, layout->pp,
                                                        out.plan.placement, micro_batch, T,
                                                        config.runtime.link_bandwidth_gbs,
                                                        config.run.seed, StageRecomputes(config)));
    }
    FR_LOG(INFO) << "emulated peers: stage " << layout->stage << " of " << layout->pp
                 << " runs for real; measured costs (ms): " << pipeline::FormatCostModel(out.cost);
    out.cost_in_ms = true;
  } else if (part_costs.has_value() && layout->pp > 1) {
    // The split's measured part costs place the bubbles where this model's stages wait from the
    // first step, and predict how long (step 1's measurements place them again).
    out.cost = CostModelFromParts(out.plan.specs, *part_costs, out.plan.placement, layout->pp,
                                  RecomputedForwardShares(config, model));
    out.cost_in_ms = true;
  }
  FR_ASSIGN_OR_RETURN(out.schedule, TrainingSchedule(config, out.plan, out.cost));
  return out;
}

absl::StatusOr<std::unique_ptr<pipeline::Transport>> TransportPhase(
    const Config& config, const pipeline::Transport* given, const PipelineSetup& pipeline,
    const pipeline::RankLayout& layout, const BackendOptions& backend, Clock* clock) {
  if (config.runtime.emulate_peers) {
    return pipeline::MakeEmulatedPeersTransport(pipeline.schedule, pipeline.cost, layout.stage,
                                                MessageTypeOf(backend), clock);
  }
  if (given == nullptr) return pipeline::MakeSelfTransport();
  return nullptr;
}

std::vector<StageSpec> OwnChunkSpecs(const PipelineSetup& pipeline,
                                     const pipeline::RankLayout& layout) {
  std::vector<StageSpec> specs;
  for (int c = 0; c < layout.chunks; ++c) {
    specs.push_back(pipeline.plan.specs[pipeline::VirtualStageOf(pipeline.plan.placement, layout.pp,
                                                                 layout.stage, c)]);
  }
  return specs;
}

absl::StatusOr<std::vector<std::unique_ptr<StageModel>>> StageModelsPhase(
    const Config& config, const GPT2Config& model, const BackendOptions& backend,
    const pipeline::RankLayout& layout, const std::vector<StageSpec>& specs, int slots,
    const std::vector<int64_t>& device_messages, bool zero_on_device) {
  std::optional<LlmcModel> weights;
  if (!config.model.init_from.empty()) {
    FR_RETURN_IF_ERROR(VerifyModelFile(config.model.init_from));
    FR_ASSIGN_OR_RETURN(weights, ReadLlmcModel(config.model.init_from));
  }
  BackendOptions own = backend;
  own.recompute = StageRecompute(config, layout.stage);
  const int64_t micro_batch = config.train.batch_size / config.train.microbatches;
  std::vector<std::unique_ptr<StageModel>> chunks;
  for (size_t c = 0; c < specs.size(); ++c) {
    const StageSpec& spec = specs[c];
    own.device_messages = c < device_messages.size() ? device_messages[c] : 0;
    if (config.parallel.zero == 1 && layout.dp > 1) {  // the share GradBuckets will give it
      own.zero_share = pipeline::SplitForZero(
                           MakeParamLayout(model, spec),
                           pipeline::BucketFloats(config.parallel.dp_bucket_mb, true), layout.dp)
                           .owned[layout.replica];
      own.zero_host_gather = !zero_on_device;
    }
    FR_ASSIGN_OR_RETURN(std::unique_ptr<StageModel> chunk,
                        MakeStageModel(own, model, spec, micro_batch, config.train.seq_len, slots));
    if (weights) {
      std::vector<float> part(MakeParamLayout(model, spec).total);
      CopyStageFromWhole(model, spec, weights->params.data(), part.data());
      FR_RETURN_IF_ERROR(chunk->SetParams(part.data()));
    } else {
      FR_RETURN_IF_ERROR(chunk->InitRandom(static_cast<uint64_t>(config.run.seed)));
    }
    chunks.push_back(std::move(chunk));
  }
  return chunks;
}

Executors ExecutorPhase(const Config& config, const PipelineSetup& pipeline,
                        const pipeline::RankLayout& layout, const std::vector<StageModel*>& chunks,
                        pipeline::Transport* transport, pipeline::OptimizerHooks hooks,
                        Clock* clock) {
  Executors out;
  out.train =
      std::make_unique<pipeline::StageExecutor>(pipeline.schedule, layout, chunks, transport,
                                                config.runtime.comm_timeout_s, std::move(hooks));
  out.train->set_clock(clock, pipeline.compute);
  out.train->set_dp_bucket_mb(config.parallel.dp_bucket_mb, config.parallel.zero == 1);
  out.train->set_zero_overlap(config.parallel.zero_overlap);
  if (!config.data.val.empty()) {
    out.eval = std::make_unique<pipeline::StageExecutor>(
        ForwardOnlySchedule(pipeline.schedule), layout, chunks, transport,
        config.runtime.comm_timeout_s, pipeline::OptimizerHooks{});
    out.eval->set_clock(clock, pipeline.compute);
  }
  return out;
}

pipeline::Schedule ForwardOnlySchedule(const pipeline::Schedule& training) {
  using pipeline::Instr;
  using pipeline::Op;
  pipeline::Schedule s = training;
  s.step_sync = pipeline::StepSync::kBarrier;  // no optimizer step to validate
  const int p = s.stages, V = p * s.chunks;
  for (int stage = 0; stage < p; ++stage) {
    std::vector<Instr>& list = s.per_stage[stage];
    list.clear();
    for (int c = 0; c < s.chunks; ++c) {
      const int vs = pipeline::VirtualStageOf(s.placement, p, stage, c);
      for (int mb = 0; mb < s.microbatches; ++mb) {
        auto add = [&](Op op, int peer) {
          Instr in;
          in.op = op;
          in.stage = stage;
          in.chunk = c;
          in.microbatch = mb;
          in.peer = peer;
          in.buffer = op == Op::kForward ? 0 : -1;
          list.push_back(in);
        };
        if (vs == 0 || vs == V - 1) add(Op::kLoad, -1);
        if (vs > 0) add(Op::kRecvAct, pipeline::StageOfVirtual(s, vs - 1));
        add(Op::kForward, -1);
        if (vs < V - 1) add(Op::kSendAct, pipeline::StageOfVirtual(s, vs + 1));
      }
    }
  }
  return s;
}

}  // namespace freeride
