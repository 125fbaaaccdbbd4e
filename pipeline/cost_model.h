// Predicted durations (milliseconds) of a schedule's operations, per stage: forward F,
// input-gradient backward B, weight-gradient backward W (a full backward costs B + W), the
// transfer time of one activation or gradient message, and the step-end collectives. A stage's
// costs are for all its layers; with v model chunks each chunk costs 1/v of them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace freeride::pipeline {

struct StageCost {
  double f = 1.0;
  double b = 1.0;
  double w = 1.0;
};

struct CostModel {
  std::vector<StageCost> stages;  // one entry applies to every stage
  // Optional, for schedules with v > 1 chunks: one entry per virtual stage c·p + s, each the
  // chunk's own cost (measured chunks differ: the embedding, the head). Empty: each chunk
  // costs 1/v of its stage's entry.
  std::vector<StageCost> chunks;
  double comm = 0.0;              // one point-to-point message
  double reduce = 0.0;            // a step-end all-reduce (data parallel; tied embeddings too
                                  // unless `tied` is set)
  std::optional<double> tied;     // the tied-embedding sum of the first and last stage
  // The data-parallel all-reduce in this many equal buckets per model chunk, bucket j (in
  // backward order) started as soon as the chunk's last backward has made its gradients, one
  // bucket at a time on the network, each taking `reduce` / (chunks × buckets); 0: one
  // all-reduce at REDUCE_GRADS, after the stage's last backward.
  int reduce_buckets = 0;
  double optimizer = 0.0;         // the optimizer update
  // Device memory, for the free memory each BUBBLE reports (0: unknown).
  int64_t memory_total = 0;       // bytes on the device
  int64_t memory_static = 0;      // parameters, gradients, optimizer state, workspace
  int64_t memory_per_buffer = 0;  // one micro-batch's stashed activations on this stage

  double Tied() const { return tied.value_or(reduce); }
  const StageCost& Stage(int s) const {
    return stages.size() == 1 ? stages[0] : stages[static_cast<size_t>(s)];
  }
  static CostModel Uniform(double f = 1, double b = 1, double w = 1, double comm = 0) {
    CostModel model;
    model.stages = {StageCost{f, b, w}};
    model.comm = comm;
    return model;
  }
};

// "f=1,b=2,w=1,comm=0.1" (any subset; also reduce=, tied=, opt=; buckets= a count); values are
// milliseconds.
absl::StatusOr<CostModel> ParseCostSpec(absl::string_view spec);
// Checks there is one entry, or one per stage (and no chunk entries, or stages × `chunks`),
// and that every value is finite and >= 0.
absl::Status CheckCostModel(const CostModel& model, int stages, int chunks = 1);
std::string FormatCostModel(const CostModel& model);

}  // namespace freeride::pipeline
