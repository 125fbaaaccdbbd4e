#include "trainer/pipeline_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "models/cuda/stage_policy.h"
#include "pipeline/generators.h"
#include "pipeline/passes.h"
#include "pipeline/schedule_file.h"
#include "pipeline/validator.h"

namespace freeride {

bool NeedsPartCosts(const Config& config) {
  const ParallelConfig& par = config.parallel;
  return par.layers_per_stage.empty() && par.partition == "balanced" &&
         (par.pp > 1 || par.chunks > 1 || par.schedule == "zbv" || par.schedule == "dualpipev" ||
          par.schedule == "file");
}

namespace {

// "3 blocks + embedding 0.00 = 3.00": what stage `stage` of `specs` holds and costs.
std::string DescribeStageCost(const std::vector<StageSpec>& specs, const PartCosts& parts,
                              pipeline::Placement placement, int pp, int stage, double cost) {
  int64_t blocks = 0;
  bool embedding = false, head = false;
  for (size_t k = 0; k < specs.size(); ++k) {
    if (pipeline::StageOfVirtual(placement, pp, static_cast<int>(k)) != stage) continue;
    blocks += specs[k].num_layers();
    embedding = embedding || specs[k].has_embedding;
    head = head || specs[k].has_head;
  }
  return absl::StrFormat(
      "stage %d: %d block%s%s%s = %.2f", stage, blocks, blocks == 1 ? "" : "s",
      embedding ? absl::StrFormat(" + embedding %.2f", parts.embedding / parts.block) : "",
      head ? absl::StrFormat(" + head %.2f", parts.head / parts.block) : "", cost);
}

std::string DescribeCosts(const std::vector<StageSpec>& specs, const PartCosts& parts,
                          pipeline::Placement placement, int pp) {
  const std::vector<double> costs = StageBlockCosts(specs, parts, placement, pp);
  std::vector<std::string> out;
  for (int s = 0; s < pp; ++s) {
    out.push_back(DescribeStageCost(specs, parts, placement, pp, s, costs[s]));
  }
  return absl::StrJoin(out, "; ");
}

// PipelinePlan::imbalance of `plan`, weighed by `parts` (from `source`).
absl::StatusOr<std::string> Imbalance(const Config& config, const GPT2Config& model,
                                      const PipelinePlan& plan, const PartCosts& parts,
                                      const std::string& source) {
  const int pp = static_cast<int>(config.parallel.pp);
  if (pp < 2 || parts.block <= 0) return std::string();
  const std::vector<double> costs = StageBlockCosts(plan.specs, parts, plan.placement, pp);
  double total = 0, most = 0, least = costs[0];
  int idlest = 0;
  for (int s = 0; s < pp; ++s) {
    total += costs[s];
    most = std::max(most, costs[s]);
    if (costs[s] < least) least = costs[s], idlest = s;
  }
  // Each step takes the costliest stage's time on every stage.
  const double idle = 1 - total / (pp * most);
  if (idle <= 1.0 / 3) return std::string();
  std::vector<int> owners(plan.specs.size());
  for (size_t k = 0; k < owners.size(); ++k) {
    owners[k] = pipeline::StageOfVirtual(plan.placement, pp, static_cast<int>(k));
  }
  FR_ASSIGN_OR_RETURN(
      std::vector<StageSpec> best,
      BalancedStages(model, static_cast<int64_t>(plan.specs.size()), parts, owners));
  const std::vector<double> best_costs = StageBlockCosts(best, parts, plan.placement, pp);
  const double best_most = *std::max_element(best_costs.begin(), best_costs.end());
  const std::string best_text =
      best_most >= most * (1 - 1e-9)
          ? "no split of whole blocks does better (this is the balanced one); fewer stages "
            "(parallel.pp), more blocks per stage (model.n_layer) or a smaller head "
            "(model.vocab_size) balance it, and side tasks (freeride.enabled) can fill the "
            "idle time"
          : absl::StrFormat(
                "the best split possible is %s (parallel.partition = \"balanced\", "
                "or parallel.layers_per_stage)",
                DescribeCosts(best, parts, plan.placement, pp));
  return absl::StrFormat(
      "the pipeline's stages cannot be balanced: estimated cost per step in transformer-block "
      "equivalents (%s): %s. The costliest stage sets every step's pace, so stage %d idles "
      "about %.0f%% of each step and %.0f%% of the pipeline's compute time is idle; %s",
      source, DescribeCosts(plan.specs, parts, plan.placement, pp), idlest,
      100 * (1 - least / most), 100 * idle, best_text);
}

}  // namespace

std::vector<double> StageBlockCosts(const std::vector<StageSpec>& specs, const PartCosts& parts,
                                    pipeline::Placement placement, int pp) {
  std::vector<double> costs(pp, 0.0);
  for (size_t k = 0; k < specs.size(); ++k) {
    const StageSpec& spec = specs[k];
    costs[pipeline::StageOfVirtual(placement, pp, static_cast<int>(k))] +=
        static_cast<double>(spec.num_layers()) +
        ((spec.has_embedding ? parts.embedding : 0) + (spec.has_head ? parts.head : 0)) /
            parts.block;
  }
  return costs;
}

absl::StatusOr<PipelinePlan> PlanPipeline(const Config& config, const GPT2Config& model,
                                          const std::optional<PartCosts>& measured) {
  const ParallelConfig& par = config.parallel;
  PipelinePlan plan;
  if (par.schedule == "file") {
    absl::StatusOr<pipeline::Schedule> loaded = pipeline::LoadScheduleFile(
        par.schedule_file, pipeline::CostModel::Uniform(), par.dp > 1);
    if (!loaded.ok()) return loaded.status();
    const pipeline::Schedule& s = *loaded;
    if (s.stages != par.pp || s.microbatches != config.train.microbatches) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "parallel.schedule_file = %s has %d stages and %d micro-batches; the run has "
          "parallel.pp = %d and train.microbatches = %d",
          par.schedule_file, s.stages, s.microbatches, par.pp, config.train.microbatches));
    }
    if (par.chunks != 1 && par.chunks != s.chunks) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "parallel.schedule_file = %s runs %d model chunks per stage; parallel.chunks = %d",
          par.schedule_file, s.chunks, par.chunks));
    }
    plan.from_file = true;
    plan.chunks = s.chunks;
    plan.placement = s.placement;
    plan.file_schedule = *std::move(loaded);
  } else {
    FR_ASSIGN_OR_RETURN(pipeline::ScheduleKind kind, pipeline::ParseScheduleKind(par.schedule));
    plan.chunks = pipeline::ChunksFor(kind, static_cast<int>(par.chunks));
    plan.placement = pipeline::PlacementOf(kind);
  }
  const int64_t virtual_stages = par.pp * plan.chunks;
  if (!par.layers_per_stage.empty() || par.partition == "even") {
    FR_ASSIGN_OR_RETURN(plan.specs,
                        SplitIntoStages(model, virtual_stages, par.layers_per_stage));
    plan.partition = par.layers_per_stage.empty() ? "even" : "parallel.layers_per_stage";
    if (par.layers_per_stage.empty() && model.n_layer % virtual_stages != 0) {
      std::vector<int64_t> counts;
      for (const StageSpec& spec : plan.specs) counts.push_back(spec.num_layers());
      plan.warning = absl::StrFormat(
          "parallel.partition = \"even\": %d blocks do not divide evenly over %d model chunks, "
          "so they are split %s (the chunks with more blocks set the pace; "
          "parallel.layers_per_stage or partition = \"balanced\" choose another split)",
          model.n_layer, virtual_stages, absl::StrJoin(counts, " + "));
    }
  } else {
    const PartCosts costs = measured ? *measured : FlopPartCosts(model, config.train.seq_len);
    std::vector<int> owners(virtual_stages);
    for (int64_t k = 0; k < virtual_stages; ++k) {
      owners[k] = pipeline::StageOfVirtual(plan.placement, static_cast<int>(par.pp),
                                           static_cast<int>(k));
    }
    FR_ASSIGN_OR_RETURN(plan.specs, BalancedStages(model, virtual_stages, costs, owners));
    plan.partition = absl::StrFormat(
        "balanced by %s (head = %.2f blocks, embedding = %.2f blocks)",
        measured ? "measured costs" : "the FLOP model", costs.head / costs.block,
        costs.embedding / costs.block);
  }
  FR_ASSIGN_OR_RETURN(plan.imbalance,
                      Imbalance(config, model, plan,
                                measured ? *measured : FlopPartCosts(model, config.train.seq_len),
                                measured ? "measured" : "the FLOP model"));
  return plan;
}

absl::StatusOr<pipeline::Schedule> TrainingSchedule(const Config& config,
                                                    const PipelinePlan& plan,
                                                    const pipeline::CostModel& cost) {
  FR_ASSIGN_OR_RETURN(const pipeline::StepSync sync,
                      pipeline::ParseStepSync(config.optim.step_sync));
  if (plan.from_file) {
    // Whatever BUBBLEs the file had were predicted with other costs: placed anew, as the
    // generated kinds' are. Post-validated, the step's sums move (InsertCommunication).
    pipeline::Schedule s = plan.file_schedule;
    if (sync != s.step_sync) {
      s.step_sync = sync;
      pipeline::InsertCommunication(&s, config.parallel.dp > 1);
      pipeline::ResolvePeers(&s);
      FR_RETURN_IF_ERROR(pipeline::Validate(s));
    }
    FR_RETURN_IF_ERROR(pipeline::InsertBubbles(&s, cost));
    return s;
  }
  pipeline::ScheduleOptions options;
  FR_ASSIGN_OR_RETURN(options.kind, pipeline::ParseScheduleKind(config.parallel.schedule));
  options.stages = static_cast<int>(config.parallel.pp);
  options.microbatches = static_cast<int>(config.train.microbatches);
  options.chunks = plan.chunks;
  options.data_parallel = config.parallel.dp > 1;
  options.step_sync = sync;
  options.cost = cost;
  return pipeline::BuildSchedule(options);
}

std::string DescribeStageChunks(const PipelinePlan& plan, int pp, int stage) {
  std::string out;
  for (int c = 0; c < plan.chunks; ++c) {
    const StageSpec& spec = plan.specs[pipeline::VirtualStageOf(plan.placement, pp, stage, c)];
    absl::StrAppend(&out, absl::StrFormat("%s[%d, %d)%s%s", c > 0 ? " " : "", spec.first_layer,
                                          spec.last_layer, spec.has_embedding ? " +embedding" : "",
                                          spec.has_head ? " +head" : ""));
  }
  return out;
}

std::string DescribePartition(const PipelinePlan& plan, int pp) {
  std::string out;
  for (int s = 0; s < pp; ++s) {
    absl::StrAppend(&out, s > 0 ? "; " : "", "stage ", s, ": ", DescribeStageChunks(plan, pp, s));
  }
  return out;
}

pipeline::CostModel CostModelFromParts(const std::vector<StageSpec>& specs, const PartCosts& parts,
                                       pipeline::Placement placement, int pp,
                                       const std::vector<double>& recomputed) {
  pipeline::CostModel cost;
  cost.stages.assign(pp, pipeline::StageCost{0, 0, 0});
  for (size_t k = 0; k < specs.size(); ++k) {
    const StageSpec& spec = specs[k];
    const double third = (spec.num_layers() * parts.block +
                          (spec.has_embedding ? parts.embedding : 0) +
                          (spec.has_head ? parts.head : 0)) / 3;
    const int rank = pipeline::StageOfVirtual(placement, pp, static_cast<int>(k));
    const double again =
        recomputed.empty() ? 0 : recomputed[rank] * spec.num_layers() * parts.block / 3;
    cost.chunks.push_back({third, third + again, third});
    pipeline::StageCost& stage = cost.stages[rank];
    stage.f += third, stage.b += third + again, stage.w += third;
  }
  if (specs.size() <= static_cast<size_t>(pp)) cost.chunks.clear();
  return cost;
}

Recompute StageRecompute(const Config& config, int stage) {
  const std::vector<std::string>& stages = config.parallel.recompute_stages;
  const std::string& name =
      stage < static_cast<int>(stages.size()) ? stages[stage] : config.model.recompute;
  absl::StatusOr<Recompute> mode = ParseRecompute(name);
  return mode.ok() ? *mode : Recompute::kNone;
}

std::vector<Recompute> StageRecomputes(const Config& config) {
  std::vector<Recompute> modes;
  for (int s = 0; s < config.parallel.pp; ++s) modes.push_back(StageRecompute(config, s));
  return modes;
}

double StageRecomputeFlopsPerTokenPerBlock(const Config& config, const GPT2Config& model,
                                           Recompute mode) {
  if (config.runtime.device != "cuda") {
    return RecomputeFlopsPerTokenPerBlock(model, config.train.seq_len, mode);
  }
  // As CudaStage decides (the config is checked, so the mode parses).
  const absl::StatusOr<cuda::GeluFusionMode> fuse =
      cuda::ParseGeluFusionMode(config.runtime.fuse_gelu);
  const bool gelu_in_product =
      !model.is_llama() && fuse.ok() && cuda::FuseGelu(*fuse, config.runtime.precision == "bf16");
  return CudaRecomputeFlopsPerTokenPerBlock(model, config.train.seq_len, mode, gelu_in_product);
}

std::vector<double> RecomputedForwardShares(const Config& config, const GPT2Config& model) {
  const double forward =
      RecomputeFlopsPerTokenPerBlock(model, config.train.seq_len, Recompute::kFull);
  std::vector<double> shares;
  for (int s = 0; s < config.parallel.pp; ++s) {
    shares.push_back(StageRecomputeFlopsPerTokenPerBlock(config, model, StageRecompute(config, s)) /
                     forward);
  }
  return shares;
}

double TrainingFlopsPerTokenWithRecompute(const Config& config, const GPT2Config& model,
                                          const PipelinePlan& plan) {
  const int pp = static_cast<int>(config.parallel.pp);
  double flops = TrainingFlopsPerToken(model, config.train.seq_len);
  for (size_t v = 0; v < plan.specs.size(); ++v) {
    const Recompute mode =
        StageRecompute(config, pipeline::StageOfVirtual(plan.placement, pp, static_cast<int>(v)));
    flops += static_cast<double>(plan.specs[v].num_layers()) *
             StageRecomputeFlopsPerTokenPerBlock(config, model, mode);
  }
  return flops;
}

}  // namespace freeride
