// The training pipeline's plan, from the config: its schedule's shape (a generated kind, or a
// schedule file trained as is), which blocks each model chunk holds (parallel.partition), and
// the schedule a rank executes once a cost model places its bubbles.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/gpt2_config.h"
#include "models/recompute.h"
#include "pipeline/cost_model.h"
#include "pipeline/schedule.h"
#include "trainer/config/config.h"

namespace freeride {

struct PipelinePlan {
  int chunks = 1;
  pipeline::Placement placement = pipeline::Placement::kLoop;
  // Per virtual stage (pp × chunks, in pipeline order): its blocks, embedding and head.
  std::vector<StageSpec> specs;
  std::string partition;  // how the split was chosen, for the log: "balanced (FLOP model) ..."
  // What the user should know of the split, or "": an "even" split of blocks that do not
  // divide evenly, whose chunks with one block more set the pipeline's pace.
  std::string warning;
  // What the user should know when the stages' costs stay far apart (more than a third of the
  // pipeline's compute time idle by the split alone), or "": each stage's cost in transformer-
  // block equivalents, the best split possible and the keys that change it.
  std::string imbalance;
  bool from_file = false;
  pipeline::Schedule file_schedule;  // parallel.schedule = "file": loaded and validated
};

// Reads the schedule file if there is one (checking it against pp, micro-batches and dp),
// and splits the model: layers_per_stage when given, else by parallel.partition, a balanced
// split weighing the parts by `measured` costs (MeasurePartCosts) or, without them, the FLOP
// model.
absl::StatusOr<PipelinePlan> PlanPipeline(const Config& config, const GPT2Config& model,
                                          const std::optional<PartCosts>& measured = {});

// Whether PlanPipeline would weigh the model's parts (a balanced split of several chunks).
bool NeedsPartCosts(const Config& config);

// Each stage's cost per step in transformer-block equivalents (its blocks, and its embedding
// and head weighed by `parts`), for `specs` placed by `placement` on `pp` ranks.
std::vector<double> StageBlockCosts(const std::vector<StageSpec>& specs, const PartCosts& parts,
                                    pipeline::Placement placement, int pp);

// The schedule every rank executes, its BUBBLEs placed with `cost` (a file's too).
absl::StatusOr<pipeline::Schedule> TrainingSchedule(const Config& config,
                                                    const PipelinePlan& plan,
                                                    const pipeline::CostModel& cost);

// "[0, 3) +embedding [7, 8) +head": the blocks of each of stage `stage`'s chunks.
std::string DescribeStageChunks(const PipelinePlan& plan, int pp, int stage);
// "stage 0: [0, 3) +embedding; stage 1: ..." (every stage's DescribeStageChunks).
std::string DescribePartition(const PipelinePlan& plan, int pp);

// What pipeline stage `stage` recomputes (all its chunks): its parallel.recompute_stages entry,
// else model.recompute. The config is checked, so the names parse.
Recompute StageRecompute(const Config& config, int stage);
// StageRecompute of every stage, stage 0 first.
std::vector<Recompute> StageRecomputes(const Config& config);

// FLOPs per token one block's recomputation adds under `mode` on the config's backend:
// RecomputeFlopsPerTokenPerBlock on the CPU, CudaRecomputeFlopsPerTokenPerBlock on CUDA (the
// GELU in the product's epilogue where runtime.fuse_gelu and the precision put it there).
double StageRecomputeFlopsPerTokenPerBlock(const Config& config, const GPT2Config& model,
                                           Recompute mode);
// Training FLOPs per token of the whole model (TrainingFlopsPerToken) plus what each block's
// recomputation adds under its stage's mode (StageRecomputeFlopsPerTokenPerBlock): the count
// MFU divides.
double TrainingFlopsPerTokenWithRecompute(const Config& config, const GPT2Config& model,
                                          const PipelinePlan& plan);

// The cost model of `specs` (pp × chunks virtual stages placed by `placement` on `pp` ranks):
// each chunk costs the sum of its parts (`parts`: F + B + W each, in any unit), split evenly
// into F, B and W as for layers made of matrix products; a rank costs the sum of its chunks,
// whose own costs are kept where there are several. `recomputed` (per rank, or empty for
// none): the share of a block's forward its backward computes again (RecomputedForwardShares),
// added to each of the rank's chunks' B.
pipeline::CostModel CostModelFromParts(const std::vector<StageSpec>& specs, const PartCosts& parts,
                                       pipeline::Placement placement, int pp,
                                       const std::vector<double>& recomputed = {});

// Per pipeline stage, the share of a block's forward FLOPs its recomputation repeats in the
// backward (StageRecomputeFlopsPerTokenPerBlock over 24·C² + 4·T·C): 1 under full; under
// selective the attention core's 4·T·C on the CPU, on CUDA 0 or the MLP product's 8·C²; 0
// under none.
std::vector<double> RecomputedForwardShares(const Config& config, const GPT2Config& model);

}  // namespace freeride
