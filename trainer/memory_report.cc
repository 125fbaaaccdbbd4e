#include "trainer/memory_report.h"

#include <algorithm>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/host_memory.h"
#include "core/status.h"
#include "models/backend.h"
#include "models/cuda/multi_tensor_table.h"
#include "models/cuda/stage_policy.h"
#include "models/device_memory_plan.h"
#include "pipeline/generators.h"
#include "pipeline/grad_buckets.h"
#include "trainer/pipeline_plan.h"
#include "trainer/rank_memory.h"
#include "trainer/trainer.h"

namespace freeride {

absl::StatusOr<std::string> ModelSummary(const Config& config) {
  FR_ASSIGN_OR_RETURN(const GPT2Config model, ResolveModelConfig(config));
  const int64_t T = config.train.seq_len, C = model.n_embd, L = model.n_layer;
  const double flops = TrainingFlopsPerToken(model, T);
  const double matmul = (flops - 12.0 * static_cast<double>(L * C * T)) / 6;
  const std::string shape =
      model.is_llama() ? absl::StrFormat(
                             "%d heads, %d key/value heads), SwiGLU %d, vocabulary %d (padded %d), "
                             "%s head",
                             model.n_head, model.n_kv_head, model.ffn_hidden, model.vocab_size,
                             model.padded_vocab_size, model.tie_embeddings ? "tied" : "untied")
                       : absl::StrFormat("%d heads), vocabulary %d (padded %d), tied head",
                                         model.n_head, model.vocab_size, model.padded_vocab_size);
  const BackendOptions backend{config.runtime.device, config.runtime.precision};
  const int64_t micro_batch = config.train.batch_size / config.train.microbatches;
  const int64_t message_bytes = micro_batch * T * C * MessageTypeBytes(MessageTypeOf(backend));
  const int64_t params = NumParameters(model);
  return absl::StrFormat(
      "model: %s, %d layers × n_embd %d (%s: %d parameters (%.4g B); training %.4g GFLOP per "
      "token at T = %d (6 × %.0f matrix-product parameters + 12·L·C·T attention); a "
      "micro-batch of %d × %d crosses each stage boundary as %s of %s activations\n",
      ModelArchName(model.arch), L, C, shape, params, static_cast<double>(params) / 1e9,
      flops / 1e9, T, matmul, micro_batch, T, FormatBytes(message_bytes),
      MessageTypeName(MessageTypeOf(backend)));
}

absl::StatusOr<std::string> DeviceMemoryReport(const Config& config) {
  absl::StatusOr<GPT2Config> model = ResolveModelConfig(config);
  if (!model.ok()) return model.status();
  absl::StatusOr<PipelinePlan> pipeline_plan = PlanPipeline(config, *model);
  if (!pipeline_plan.ok()) return pipeline_plan.status();
  absl::StatusOr<pipeline::Schedule> schedule =
      TrainingSchedule(config, *pipeline_plan, pipeline::CostModel::Uniform());
  if (!schedule.ok()) return schedule.status();
  const int pp = schedule->stages, chunks = schedule->chunks;
  const std::vector<StageSpec>& specs = pipeline_plan->specs;
  const int64_t micro_batch = config.train.batch_size / config.train.microbatches;
  const int bytes = config.runtime.precision == "bf16" ? 2 : 4;
  absl::StatusOr<cuda::AttentionMode> attention =
      cuda::ParseAttentionMode(config.runtime.attention);
  if (!attention.ok()) return attention.status();
  std::string out = absl::StrFormat(
      "device memory per rank on the CUDA backend: %s, micro-batch %d × %d, %s schedule, "
      "%d stage(s) × %d chunk(s); a rank also keeps %.2f GiB free beyond its plan (lazily "
      "loaded kernels, library state, NCCL)%s\n",
      config.runtime.precision, micro_batch, config.train.seq_len, config.parallel.schedule, pp,
      chunks, cuda::kDeviceHeadroomBytes / double(int64_t{1} << 30),
      config.parallel.zero == 1 && config.parallel.dp > 1
          ? (config.runtime.precision == "bf16"
                 ? "; ZeRO-1: the AdamW moments and fp32 master copy (in the optimizer phase) of "
                   "the rank with the stage's largest share"
                 : "; ZeRO-1: the AdamW moments of the rank with the stage's largest share")
          : "");
  const int dp = static_cast<int>(config.parallel.dp);
  const bool zero = config.parallel.zero == 1 && dp > 1;
  for (int s = 0; s < pp; ++s) {
    const int slots = std::max(1, schedule->buffers_per_stage[s]);
    const Recompute mode = StageRecompute(config, s);
    std::vector<StageSpec> stage_specs;
    for (int c = 0; c < chunks; ++c) {
      stage_specs.push_back(specs[pipeline::VirtualStageOf(pipeline_plan->placement, pp, s, c)]);
    }
    // ZeRO-1: the rank with the largest share of the stage's moments (the plan is its).
    int largest = 0;
    std::vector<int64_t> held(dp, 0);
    for (int r = 0; zero && r < dp; ++r) {
      for (const StageSpec& spec : stage_specs) held[r] += ZeroShareElements(*model, spec, dp, r);
      if (held[r] > held[largest]) largest = r;
    }
    MemoryPlan plan;
    for (const StageSpec& spec : stage_specs) {
      PlanStageMemory(*model, spec, micro_batch, config.train.seq_len, slots, bytes, &plan, true,
                      *attention, mode, CudaOptimizerShare(config, *model, spec, largest));
    }
    out += absl::StrFormat("stage %d: layers %s; recompute %s; %d activation slot(s): %s\n", s,
                           DescribeStageChunks(*pipeline_plan, pp, s), RecomputeName(mode), slots,
                           plan.Report());
  }
  return out;
}

int64_t ZeroShareElements(const GPT2Config& model, const StageSpec& spec, int dp, int member) {
  const ParamLayout layout = MakeParamLayout(model, spec);
  // The shares do not depend on the bucket size: any will do.
  const pipeline::ZeroSplit split = pipeline::SplitForZero(layout, layout.total + 1, dp);
  return split.bounds[member + 1] - split.bounds[member];
}

OptimizerShare CudaOptimizerShare(const Config& config, const GPT2Config& model,
                                  const StageSpec& spec, int member) {
  const int dp = static_cast<int>(config.parallel.dp);
  if (config.parallel.zero != 1 || dp <= 1) return {};
  const ParamLayout layout = MakeParamLayout(model, spec);
  // The buckets the trainer cuts (their size moves where the share's ranges split, so the
  // AdamW table's length).
  const pipeline::ZeroSplit split = pipeline::SplitForZero(
      layout, pipeline::BucketFloats(config.parallel.dp_bucket_mb, true), dp);
  const std::vector<ParamRange>& owned = split.owned[member];
  return {split.bounds[member + 1] - split.bounds[member], cuda::ShareTableChunks(owned)};
}

absl::StatusOr<std::string> HostMemoryReport(const Config& config) {
  absl::StatusOr<GPT2Config> model = ResolveModelConfig(config);
  if (!model.ok()) return model.status();
  absl::StatusOr<PipelinePlan> pipeline_plan = PlanPipeline(config, *model);
  if (!pipeline_plan.ok()) return pipeline_plan.status();
  absl::StatusOr<pipeline::Schedule> schedule =
      TrainingSchedule(config, *pipeline_plan, pipeline::CostModel::Uniform());
  if (!schedule.ok()) return schedule.status();
  const int pp = schedule->stages, chunks = schedule->chunks;
  const int64_t micro_batch = config.train.batch_size / config.train.microbatches;
  const int64_t T = config.train.seq_len;
  const MemoryFacts facts = PlanningFacts(config);
  FR_ASSIGN_OR_RETURN(const std::vector<RankMemoryPlan> peaks, PlanStagesMemory(config, facts));
  std::string out = absl::StrFormat(
      "host memory per rank on the CPU backend: fp32, micro-batch %d × %d, %s schedule; the "
      "peak adds the process before its model (%s: %s), the message buffers, the batch and "
      "MPI's temporaries\n",
      micro_batch, T, config.parallel.schedule, facts.baseline_source,
      FormatBytes(facts.baseline_bytes));
  const int dp = static_cast<int>(config.parallel.dp);
  const bool zero = config.parallel.zero == 1 && dp > 1;
  for (int s = 0; s < pp; ++s) {
    const int slots = std::max(1, schedule->buffers_per_stage[s]);
    const Recompute mode = StageRecompute(config, s);
    std::vector<StageSpec> specs;
    for (int c = 0; c < chunks; ++c) {
      specs.push_back(
          pipeline_plan->specs[pipeline::VirtualStageOf(pipeline_plan->placement, pp, s, c)]);
    }
    // ZeRO-1: the rank with the largest share of the stage's moments (the plan is its).
    int largest = 0;
    std::vector<int64_t> held(dp, 0);
    for (int r = 0; zero && r < dp; ++r) {
      for (const StageSpec& spec : specs) held[r] += ZeroShareElements(*model, spec, dp, r);
      if (held[r] > held[largest]) largest = r;
    }
    int64_t per_slot = 0, recomputed = 0, moments = 0, total = 0;
    for (const StageSpec& spec : specs) {
      const int64_t share = zero ? ZeroShareElements(*model, spec, dp, largest) : -1;
      const auto plan = [&](int n) {
        return PlanCpuStageMemory(*model, spec, micro_batch, T, n, mode, share);
      };
      // A slot's bytes: the plan with one slot less.
      const int64_t all = TotalBytes(plan(slots));
      per_slot += all - TotalBytes(plan(slots - 1));
      for (const HostBuffer& b : plan(slots)) {
        if (absl::StartsWith(b.name, "recomputed activations")) recomputed += b.bytes;
        if (absl::StartsWith(b.name, "AdamW moments")) moments += b.bytes;
      }
      total += all;
    }
    int64_t whole = 0;
    for (const StageSpec& spec : specs) whole += MakeParamLayout(*model, spec).total;
    // The buckets pack the stage's gradients into a copy of their own to send.
    const bool buckets = dp > 1 && (zero || config.parallel.dp_bucket_mb > 0);
    const int64_t staging = buckets ? whole * static_cast<int64_t>(sizeof(float)) : 0;
    total += staging;
    const std::string sharded =
        zero ? absl::StrFormat(" (ZeRO-1: the largest of %d shares; all of them: %s)", dp,
                               FormatBytes(2 * whole * static_cast<int64_t>(sizeof(float))))
             : "";
    // The rest of the rank's peak: what the run allocates beside its chunks.
    std::vector<std::string> beside = {
        absl::StrFormat("the process %s", FormatBytes(peaks[s].baseline_bytes))};
    for (const HostBuffer& b : peaks[s].buffers) {
      for (const char* name : {"message buffers", "the global batch's tokens",
                               "post-validation's copy", "MPI's temporary"}) {
        if (absl::StartsWith(b.name, name)) {
          beside.push_back(absl::StrFormat("%s %s", b.name, FormatBytes(b.bytes)));
        }
      }
    }
    out += absl::StrFormat(
        "stage %d: layers %s; recompute %s; %d activation slot(s) of %s each, %s recomputed "
        "(shared by the slots); AdamW moments %s per rank%s;%s %s; with %s: peak %s\n",
        s, DescribeStageChunks(*pipeline_plan, pp, s), RecomputeName(mode), slots,
        FormatBytes(per_slot), FormatBytes(recomputed), FormatBytes(moments), sharded,
        buckets ? absl::StrFormat(" the data-parallel buckets' copy %s;", FormatBytes(staging))
                : "",
        FormatBytes(total), absl::StrJoin(beside, ", "), FormatBytes(peaks[s].peak_bytes));
  }
  return out;
}

absl::StatusOr<std::string> SideWorkReport(const Config& config) {
  const MemoryFacts facts = PlanningFacts(config);
  FR_ASSIGN_OR_RETURN(const std::vector<RankMemoryPlan> plans, PlanStagesMemory(config, facts));
  const bool cuda = config.runtime.device == "cuda";
  std::string device = facts.device_bytes > 0
                           ? absl::StrFormat("%s %s (%s)", cuda ? "the GPU's" : "the host's",
                                             FormatBytes(facts.device_bytes), facts.device_source)
                           : absl::StrFormat("the GPU's, unknown (%s)", facts.device_source);
  if (facts.sharing > 1) {
    device += absl::StrFormat(", shared by the run's %d ranks on one machine", facts.sharing);
  }
  std::string out = absl::StrFormat(
      "memory for side work per rank: runtime.memory_fraction = %.2f of %s, less training's "
      "planned peak\n",
      config.runtime.memory_fraction, device);
  for (const RankMemoryPlan& plan : plans) {
    out += absl::StrFormat("stage %d: training's peak %s; side work %s (%s)\n", plan.stage,
                           FormatBytes(plan.peak_bytes),
                           plan.device_bytes > 0 ? FormatBytes(plan.side_bytes) : "unknown",
                           DescribeSideRoom(plan));
  }
  return out;
}

}  // namespace freeride
