#include "trainer/study/projection_memory.h"

#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/cuda/stage_policy.h"
#include "models/device_memory_plan.h"
#include "pipeline/grad_buckets.h"

namespace freeride {
namespace {

// A block's forward buffers in the CUDA plan's slots ("slot 0 NAME"), each [L, ...]: what full
// recomputation makes again from the block's input (residual3 is the next block's input).
const std::set<std::string>& LayerForwardBuffers() {
  static const std::set<std::string> names = {"ln1",
                                              "ln1 mean",
                                              "ln1 rstd",
                                              "qkv",
                                              "attention log-sum-exp",
                                              "attention output",
                                              "residual2",
                                              "ln2",
                                              "ln2 mean",
                                              "ln2 rstd",
                                              "fch",
                                              "fch gelu",
                                              "residual3"};
  return names;
}

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
  int64_t params = 0, master = 0, compute = 0, scratch = 0;
  for (const StageSpec& spec : chunks) {
    params += MakeParamLayout(model, spec).total;
    MemoryPlan plan;
    PlanStageMemory(model, spec, micro_batch, seq_len, slots, compute_bytes, &plan);
    // One slot's buffers: all of them, the activation output, what full recomputation remakes.
    int64_t slot = 0, activation_output = 0, recomputable = 0;
    for (const PlannedBuffer& b : plan.buffers()) {
      switch (b.phase) {
        case MemoryPhase::kParameters:
          (b.name == "master (fp32)" ? master : compute) += b.bytes;
          break;
        case MemoryPhase::kGradients:
          out.gradients += b.bytes;
          break;
        case MemoryPhase::kOptimizer:
          out.optimizer += b.bytes;
          break;
        case MemoryPhase::kWorkspace:
          out.workspace += b.bytes;
          break;
        case MemoryPhase::kActivations: {
          if (!absl::StartsWith(b.name, "slot 0 ")) break;
          const std::string name = b.name.substr(7);
          slot += b.bytes;
          if (name == "fch gelu") activation_output += b.bytes;
          if (LayerForwardBuffers().count(name) && name != "residual3") recomputable += b.bytes;
          break;
        }
      }
    }
    // What a slot keeps, and one layer's recomputed buffers: the scratch every slot (and every
    // chunk of the stage: one computes at a time) shares.
    const int64_t layers = std::max<int64_t>(1, spec.num_layers());
    int64_t kept = slot, one_layer = 0;
    if (option.recompute == Recompute::kSelective) {
      kept -= activation_output;
      one_layer = activation_output / layers;
    } else if (option.recompute == Recompute::kFull) {
      kept -= recomputable;
      one_layer = recomputable / layers;
    }
    out.activations += slots * kept;
    scratch = std::max(scratch, one_layer);
  }
  out.activations += scratch;
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
      "activations (slots × what a micro-batch keeps, and the recomputation's scratch), the "
      "plan's workspace and the rank's reserve (%.2f GiB); the rest of the GPU is what side "
      "tasks and fill jobs can be placed in.\n",
      bf16 ? " and the bf16 compute copy" : "", Gib(cuda::kDeviceHeadroomBytes));
  return md;
}

}  // namespace freeride
