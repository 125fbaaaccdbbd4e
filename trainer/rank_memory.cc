#include "trainer/rank_memory.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/device.h"
#include "core/status.h"
#include "models/backend.h"
#include "models/cuda/stage_policy.h"
#include "models/device_memory_plan.h"
#include "pipeline/generators.h"
#include "trainer/memory_report.h"
#include "trainer/pipeline_plan.h"
#include "trainer/trainer.h"
#include "trainer/transport_choice.h"

namespace freeride {
namespace {

constexpr int64_t kFloat = sizeof(float);

// The replica whose rank of `stage` holds the largest ZeRO-1 share of its moments (0 without
// ZeRO-1).
int LargestShareReplica(const Config& config, const GPT2Config& model,
                        const std::vector<StageSpec>& specs) {
  const int dp = static_cast<int>(config.parallel.dp);
  if (config.parallel.zero != 1 || dp <= 1) return 0;
  int largest = 0;
  std::vector<int64_t> held(dp, 0);
  for (int r = 0; r < dp; ++r) {
    for (const StageSpec& spec : specs) held[r] += ZeroShareElements(model, spec, dp, r);
    if (held[r] > held[largest]) largest = r;
  }
  return largest;
}

std::vector<StageSpec> StageChunks(const PipelinePlan& plan, int pp, int chunks, int stage) {
  std::vector<StageSpec> specs;
  for (int c = 0; c < chunks; ++c) {
    specs.push_back(plan.specs[pipeline::VirtualStageOf(plan.placement, pp, stage, c)]);
  }
  return specs;
}

// The message buffers the stage's executors allocate: one per send and receive of the
// training schedule, and, with validation data, one per activation send and receive of the
// forward-only schedule that evaluates.
int64_t MessageCount(const Config& config, const pipeline::Schedule& schedule, int stage) {
  using pipeline::Op;
  int64_t all = 0, activations = 0;
  for (const pipeline::Instr& in : schedule.per_stage[stage]) {
    const bool act = in.op == Op::kSendAct || in.op == Op::kRecvAct;
    all += act || in.op == Op::kSendGrad || in.op == Op::kRecvGrad;
    activations += act;
  }
  return all + (config.data.val.empty() ? 0 : activations);
}

// The CPU backend's host memory of the rank (every term but the baseline).
std::vector<HostBuffer> CpuBuffers(const Config& config, const GPT2Config& model,
                                   const std::vector<StageSpec>& specs, int slots, int stage,
                                   int replica) {
  const int64_t micro_batch = config.train.batch_size / config.train.microbatches;
  const int64_t T = config.train.seq_len;
  const int dp = static_cast<int>(config.parallel.dp);
  const bool zero = config.parallel.zero == 1 && dp > 1;
  std::vector<HostBuffer> plan;
  for (const StageSpec& spec : specs) {
    const int64_t share = zero ? ZeroShareElements(model, spec, dp, replica) : -1;
    for (HostBuffer& b : PlanCpuStageMemory(model, spec, micro_batch, T, slots,
                                            StageRecompute(config, stage), share)) {
      if (specs.size() > 1) {
        b.name =
            absl::StrFormat("chunk layers %d..%d: %s", spec.first_layer, spec.last_layer, b.name);
      }
      plan.push_back(b);
    }
  }
  return plan;
}

}  // namespace

int64_t ProcessBaselineBytes() {
  static const int64_t baseline = ResidentBytes();
  return baseline;
}

void FindDeviceMemory(const Config& config, MemoryFacts* facts) {
  if (config.runtime.device_memory_mb > 0) {
    facts->device_bytes = static_cast<int64_t>(
        std::llround(config.runtime.device_memory_mb * static_cast<double>(1 << 20)));
    facts->device_source = "runtime.device_memory_mb";
    return;
  }
  if (config.runtime.device == "cuda") {
    const DeviceInventory devices = DiscoverDevices();
    facts->device_bytes = 0;
    facts->device_source = "no GPU visible here: set runtime.device_memory_mb";
    if (!devices.cuda.empty()) {
      const int gpu = GpuOf(config);
      const DeviceInfo& device = devices.cuda[gpu % devices.cuda.size()];
      facts->device_bytes = static_cast<int64_t>(device.total_memory_bytes);
      facts->device_source = absl::StrFormat("cuda:%d's total", device.index);
    }
    return;
  }
  const HostMemoryBudget total = TotalHostMemory();
  facts->device_bytes = total.bytes;
  facts->device_source = total.source;
}

MemoryFacts PlanningFacts(const Config& config) {
  MemoryFacts facts;
  const int64_t ranks = config.parallel.pp * config.parallel.dp;
  const bool several = ranks > 1 && !config.runtime.emulate_peers;
  facts.baseline_bytes = ProcessBaselineBytes() + (several ? kMpiInitBytes : 0);
  facts.baseline_source =
      several ? "this process's resident set and MPI's initialisation" : "this process's";
  FindDeviceMemory(config, &facts);
  facts.sharing = config.runtime.device == "cuda" || !several ? 1 : static_cast<int>(ranks);
  facts.mpi = several;
  const absl::StatusOr<TransportChoice> transport =
      ChooseTransport(config, static_cast<int>(ranks), /*nccl_across_processes=*/true);
  facts.device_transport = transport.ok() && transport->nccl;
  return facts;
}

absl::StatusOr<RankMemoryPlan> PlanRankMemory(const Config& config, const GPT2Config& model,
                                              const PipelinePlan& pipeline_plan,
                                              const pipeline::Schedule& schedule, int stage,
                                              int replica, const MemoryFacts& facts) {
  const int pp = schedule.stages, chunks = schedule.chunks;
  const std::vector<StageSpec> specs = StageChunks(pipeline_plan, pp, chunks, stage);
  const int slots = std::max(1, schedule.buffers_per_stage[stage]);
  const TrainConfig& tc = config.train;
  const int64_t micro_batch = tc.batch_size / tc.microbatches;
  const int dp = static_cast<int>(config.parallel.dp);
  const bool zero = config.parallel.zero == 1 && dp > 1;
  const bool cuda = config.runtime.device == "cuda";
  RankMemoryPlan out;
  out.stage = stage;
  out.cuda = cuda;
  out.fraction = config.runtime.memory_fraction;
  int64_t params = 0, moments = 0;
  for (const StageSpec& spec : specs) {
    const int64_t whole = MakeParamLayout(model, spec).total;
    params += whole;
    moments += zero ? ZeroShareElements(model, spec, dp, replica) : whole;
  }
  // What the host holds beside the chunks, on either device.
  std::vector<HostBuffer> beside;
  const MessageType type =
      MessageTypeOf(BackendOptions{config.runtime.device, config.runtime.precision});
  const int64_t message = micro_batch * tc.seq_len * model.n_embd * MessageTypeBytes(type);
  beside.push_back({"message buffers", MessageCount(config, schedule, stage) * message});
  beside.push_back({"the global batch's tokens",
                    2 * tc.batch_size * dp * tc.seq_len * static_cast<int64_t>(sizeof(int32_t))});
  if (dp > 1 && (zero || config.parallel.dp_bucket_mb > 0)) {
    beside.push_back({"the data-parallel buckets' copy of the gradients", params * kFloat});
  }
  if (config.optim.step_sync == "post_validate") {
    beside.push_back({"post-validation's copy of parameters and AdamW moments",
                      (params + 2 * moments) * kFloat});
  }
  if (facts.mpi && dp > 1 && !cuda) {
    beside.push_back({"MPI's temporary for the data-parallel sum", params * kFloat});
  }
  if (cuda && zero && !facts.device_transport) {  // over NCCL it gathers in place on the GPU
    beside.push_back(
        {"ZeRO-1's pinned copy of the parameters for the all-gather", params * kFloat});
    if (config.runtime.precision == "bf16") {
      beside.push_back({"ZeRO-1's pinned copy of the bf16 weights it is widened from",
                        params * static_cast<int64_t>(sizeof(uint16_t))});
    }
  }
  if (cuda) {
    // The GPU's own plan, as the CUDA chunk allocates it under the stage's recompute mode and
    // (ZeRO-1) with this rank's share of the moments.
    FR_ASSIGN_OR_RETURN(const cuda::AttentionMode attention,
                        cuda::ParseAttentionMode(config.runtime.attention));
    MemoryPlan plan;
    for (const StageSpec& spec : specs) {
      PlanStageMemory(model, spec, micro_batch, tc.seq_len, slots,
                      config.runtime.precision == "bf16" ? 2 : 4, &plan, true, attention,
                      StageRecompute(config, stage),
                      CudaOptimizerShare(config, model, spec, replica));
    }
    for (int p = 0; p < kNumMemoryPhases; ++p) {
      const MemoryPhase phase = static_cast<MemoryPhase>(p);
      out.buffers.push_back({MemoryPhaseName(phase), plan.PhaseBytes(phase)});
    }
    out.baseline_bytes = cuda::kDeviceHeadroomBytes;
    out.host_buffers = beside;
  } else {
    out.buffers = CpuBuffers(config, model, specs, slots, stage, replica);
    out.buffers.insert(out.buffers.end(), beside.begin(), beside.end());
    out.baseline_bytes = facts.baseline_bytes;
    out.host_buffers = out.buffers;
  }
  out.peak_bytes = out.baseline_bytes + TotalBytes(out.buffers);
  if (facts.device_bytes > 0) {
    out.device_bytes = facts.device_bytes / std::max(1, facts.sharing);
    const int64_t room = static_cast<int64_t>(out.fraction * static_cast<double>(out.device_bytes));
    out.side_bytes = std::max<int64_t>(0, room - out.peak_bytes);
  }
  return out;
}

absl::StatusOr<std::vector<RankMemoryPlan>> PlanStagesMemory(const Config& config,
                                                             const MemoryFacts& facts) {
  FR_ASSIGN_OR_RETURN(const GPT2Config model, ResolveModelConfig(config));
  FR_ASSIGN_OR_RETURN(const PipelinePlan plan, PlanPipeline(config, model));
  FR_ASSIGN_OR_RETURN(const pipeline::Schedule schedule,
                      TrainingSchedule(config, plan, pipeline::CostModel::Uniform()));
  std::vector<RankMemoryPlan> out;
  for (int s = 0; s < schedule.stages; ++s) {
    const int replica =
        LargestShareReplica(config, model, StageChunks(plan, schedule.stages, schedule.chunks, s));
    FR_ASSIGN_OR_RETURN(RankMemoryPlan stage,
                        PlanRankMemory(config, model, plan, schedule, s, replica, facts));
    out.push_back(std::move(stage));
  }
  return out;
}

absl::Status CheckDevicePlan(const RankMemoryPlan& plan, const std::string& device_source) {
  if (!plan.cuda || plan.device_bytes <= 0 || plan.peak_bytes <= plan.device_bytes) {
    return absl::OkStatus();
  }
  std::vector<std::string> phases;
  for (const HostBuffer& b : plan.buffers) {
    phases.push_back(absl::StrFormat("%s %s", b.name, FormatBytes(b.bytes)));
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "stage %d's rank needs %s of GPU memory at its peak (%s, and %s kept for kernels and "
      "libraries), more than the device's %s (%s); lower train.batch_size or raise "
      "train.microbatches, recompute (model.recompute), shard the optimizer state "
      "(parallel.zero = 1 with parallel.dp > 1), or spread the model over more stages",
      plan.stage, FormatBytes(plan.peak_bytes), absl::StrJoin(phases, ", "),
      FormatBytes(plan.baseline_bytes), FormatBytes(plan.device_bytes), device_source));
}

std::string DescribeSideRoom(const RankMemoryPlan& plan) {
  if (plan.device_bytes <= 0) {
    return absl::StrFormat("training's planned peak %s; the device's memory is unknown",
                           FormatBytes(plan.peak_bytes));
  }
  return absl::StrFormat("runtime.memory_fraction %.2f × %s − training's planned peak %s",
                         plan.fraction, FormatBytes(plan.device_bytes),
                         FormatBytes(plan.peak_bytes));
}

std::vector<SideRoom> SideRooms(const std::vector<RankMemoryPlan>& plans) {
  std::vector<SideRoom> rooms;
  for (const RankMemoryPlan& plan : plans) {
    if (plan.device_bytes <= 0) return {};
    rooms.push_back({plan.side_bytes, DescribeSideRoom(plan)});
  }
  return rooms;
}

std::vector<SideRoom> PlannedSideRooms(const Config& config) {
  absl::StatusOr<std::vector<RankMemoryPlan>> plans =
      PlanStagesMemory(config, PlanningFacts(config));
  return plans.ok() ? SideRooms(*plans) : std::vector<SideRoom>{};
}

}  // namespace freeride
