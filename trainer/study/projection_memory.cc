#include "trainer/study/projection_memory.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/cuda/stage_policy.h"
#include "models/device_memory_plan.h"
#include "pipeline/grad_buckets.h"

namespace freeride {
namespace {

double Gib(int64_t bytes) { return static_cast<double>(bytes) / static_cast<double>(1 << 30); }

}  // namespace

std::vector<MemoryOption> AllMemoryOptions() {
  std::vector<MemoryOption> options;
  for (Recompute mode : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    options.push_back({mode, false});
    options.push_back({mode, true});
  }
  return options;
}

std::string MemoryOptionName(const MemoryOption& option) {
  return absl::StrCat(RecomputeName(option.recompute), option.zero ? " + ZeRO-1" : "");
}

int64_t LargestZeroShare(const GPT2Config& model, const std::vector<StageSpec>& chunks,
                         int64_t dp) {
  std::vector<int64_t> held(std::max<int64_t>(dp, 1), 0);
  for (const StageSpec& spec : chunks) {
    const ParamLayout layout = MakeParamLayout(model, spec);
    if (dp <= 1) {
      held[0] += layout.total;
      continue;
    }
    // The shares do not depend on the bucket size: one bucket will do.
    const pipeline::ZeroSplit split =
        pipeline::SplitForZero(layout, layout.total + 1, static_cast<int>(dp));
    for (int64_t r = 0; r < dp; ++r) held[r] += split.bounds[r + 1] - split.bounds[r];
  }
  return *std::max_element(held.begin(), held.end());
}

StageDeviceMemory PlanProjectedStage(const GPT2Config& model, const std::vector<StageSpec>& chunks,
                                     int slots, int64_t micro_batch, int64_t seq_len,
                                     int compute_bytes, int64_t dp, const MemoryOption& option) {
  StageDeviceMemory out;
  out.reserve = cuda::kDeviceHeadroomBytes;
  // The chunks' plans in one, as `config memory` adds them: each chunk allocates its own
  // buffers, the recomputation's shared ones included.
  MemoryPlan plan;
  int64_t params = 0, master = 0, compute = 0;
  for (const StageSpec& spec : chunks) {
    params += MakeParamLayout(model, spec).total;
    const StageBufferIds ids =
        PlanStageMemory(model, spec, micro_batch, seq_len, slots, compute_bytes, &plan,
                        /*training=*/true, cuda::AttentionMode::kAuto, option.recompute);
    master += plan.buffer(ids.master).bytes;
    compute += plan.buffer(ids.compute).bytes;
  }
  out.gradients = plan.PhaseBytes(MemoryPhase::kGradients);
  out.optimizer = plan.PhaseBytes(MemoryPhase::kOptimizer);
  out.activations = plan.PhaseBytes(MemoryPhase::kActivations);
  out.workspace = plan.PhaseBytes(MemoryPhase::kWorkspace);
  const int64_t share = option.zero ? LargestZeroShare(model, chunks, dp) : params;
  // In fp32 the master copy is the weights the forward reads: whole on every rank.
  const bool master_sharded = option.zero && compute_bytes < 4;
  out.parameters = compute + (master_sharded ? share * 4 : master);
  if (option.zero) out.optimizer = 2 * share * 4;
  return out;
}

std::string ProjectionMemoryMarkdown(const GPT2Config& model, const Projection& projection,
                                     const ProjectionOptions& options) {
  const std::vector<MemoryOption> all = AllMemoryOptions();
  const bool bf16 = options.compute_bytes == 2;
  std::string md = absl::StrFormat(
      "\n## Memory per stage\n\nDevice memory per rank on the CUDA backend (%s weights and "
      "activations, micro-batch %d × %d) of each stage of the fastest layouts above, under each "
      "memory option: total GiB / GiB left for side work on a %.4g GiB GPU (negative: it does "
      "not fit). Slots: the micro-batches the stage holds in flight. ZeRO-1 keeps the AdamW "
      "moments%s of about 1/dp of the stage's parameters per rank.\n\n"
      "| GPUs | schedule | pp × dp | stage | slots |",
      bf16 ? "bf16" : "fp32", options.micro_batch, options.seq_len, options.device_gib,
      bf16 ? " and the fp32 master copy" : "");
  for (const MemoryOption& option : all) absl::StrAppend(&md, " ", MemoryOptionName(option), " |");
  absl::StrAppend(&md, "\n|---|---|---|---|---|");
  for (size_t i = 0; i < all.size(); ++i) absl::StrAppend(&md, "---|");
  md += "\n";
  const int64_t device = static_cast<int64_t>(options.device_gib * (1 << 30));
  for (const ProjectionRow& r : BestRows(projection)) {
    for (size_t s = 0; s < r.stage_chunks.size(); ++s) {
      absl::StrAppendFormat(&md, "| %d | %s | %d × %d | %d | %d |", r.gpus,
                            pipeline::ScheduleKindName(r.kind), r.pp, r.dp, s, r.stage_slots[s]);
      for (const MemoryOption& option : all) {
        const int64_t total =
            PlanProjectedStage(model, r.stage_chunks[s], r.stage_slots[s], options.micro_batch,
                               options.seq_len, options.compute_bytes, r.dp, option)
                .total();
        absl::StrAppendFormat(&md, " %.1f / %.1f |", Gib(total), Gib(device - total));
      }
      md += "\n";
    }
  }
  absl::StrAppendFormat(
      &md,
      "\nEach cell: the stage's parameters (the fp32 master%s), fp32 gradients, AdamW moments, "
      "activations (slots × what a micro-batch keeps, and the buffers full recomputation's "
      "slots share), the plan's workspace and the rank's reserve (%.2f GiB); the rest of the "
      "GPU is what side tasks and fill jobs can be placed in.\n",
      bf16 ? " and the bf16 compute copy" : "", Gib(cuda::kDeviceHeadroomBytes));
  return md;
}

}  // namespace freeride
