// `freeride project`: what a training job's bubbles, and the side work they could hold, become
// at scale. For a model, a global batch and a schedule kind, every (pp, dp) that fits N GPUs is
// timed by simulating one pipeline (all dp replicas run the same schedule) from per-part costs
// measured on this device or from the FLOP model: micro-batches per pipeline = global batch /
// (dp × micro-batch); the stages balanced as the trainer balances them; activations cross
// stages over a link and gradients are all-reduced over dp ranks by the α–β formulas of
// pipeline/network.h. The side work is packed into the simulated bubbles by the executor's
// rule: an in-process task's whole steps that fit a bubble less its margin, a worker filling it
// to the margin. Assumed: no stragglers, the same costs per micro-batch at every scale, one
// all-reduce per step after the stage's last backward (or, with dp_bucket_mb, in buckets each
// started as the last backward makes it), the tied-embedding sum of the first and last stage,
// then the optimizer step of the rank with the most parameters: behind a barrier of every
// stage, or post-validated (the steady period of consecutive steps). Side work is packed into
// the bubbles the runtime places (every kind but the sync waits). docs/scale.md says what this
// leaves out.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/gpt2_config.h"
#include "pipeline/network.h"
#include "pipeline/schedule.h"

namespace freeride {

struct ProjectedTask {
  std::string name;
  double step_ms = 0;     // one step alone
  bool pausable = false;  // in a worker: runs to the bubble's margin; in process: whole steps
};

struct ProjectionOptions {
  std::vector<int64_t> gpus;         // the GPU counts to project
  int64_t global_batch = 0;          // sequences per optimizer step
  int64_t micro_batch = 1;           // sequences per micro-batch
  int64_t seq_len = 0;
  std::vector<pipeline::ScheduleKind> kinds;
  int chunks = 2;                    // model chunks per stage for interleaved
  PartCosts costs;                   // ms per micro-batch (F + B + W) of each model part
  int64_t bytes_per_value = 4;       // weight gradients (the sums across ranks)
  int64_t message_bytes_per_value = 4;  // activations and their gradients (2 in bf16)
  pipeline::Network link;            // between adjacent pipeline stages
  pipeline::Network network;         // the data-parallel all-reduce
  pipeline::AllReduceAlgorithm algorithm = pipeline::AllReduceAlgorithm::kRing;
  std::vector<ProjectedTask> tasks;  // in the order the executor offers bubbles
  double margin = 0.1;               // of each bubble left unharvested (freeride.margin)
  double optimizer_ms_per_param = 0; // the AdamW update, timed per parameter (0: left out)
  pipeline::StepSync step_sync = pipeline::StepSync::kBarrier;  // optim.step_sync
  double dp_bucket_mb = 0;  // the all-reduce's buckets (MiB); 0: one after the last backward
  // The transport's link model that set `link` and `network` (pipeline/link_model.h), for the
  // header; empty where the flags gave them.
  std::string links;
  // The memory table (projection_memory.h): bytes per weight and activation on the device
  // (2: bf16, 4: fp32), and each GPU's memory, GiB.
  int compute_bytes = 4;
  double device_gib = 80;
};

struct ProjectionRow {
  int64_t gpus = 0, pp = 0, dp = 0, microbatches = 0;
  pipeline::ScheduleKind kind = pipeline::ScheduleKind::k1F1B;
  int chunks = 1;
  double step_ms = 0;
  double allreduce_ms = 0;     // the data-parallel all-reduce of the largest rank's gradients
  double exposed_sync_ms = 0;  // the most any stage waits for its own sums (`sync` bubble)
  double bubble_fraction = 0;  // of all GPU time
  std::array<double, pipeline::kNumBubbleKinds> bubble_by_kind{};  // fractions of GPU time
  double harvested_fraction = 0;  // side work packed into bubbles, of all GPU time
  double tokens_per_s = 0;
  // Per stage: its chunks' layers (chunk order), and the micro-batches it holds in flight (the
  // schedule's activation slots): what the memory table plans.
  std::vector<std::vector<StageSpec>> stage_chunks;
  std::vector<int> stage_slots;
  double bubble_gpus() const { return bubble_fraction * static_cast<double>(gpus); }
  double reclaimed_gpus() const { return harvested_fraction * static_cast<double>(gpus); }
};

struct Projection {
  std::vector<ProjectionRow> rows;   // every (gpus, kind, pp) that fits
  std::vector<std::string> skipped;  // per (gpus, kind): why nothing fit, where nothing did
};

absl::StatusOr<Projection> Project(const GPT2Config& model, const ProjectionOptions& options);

// The tied-embedding sum of a pipeline (pp > 1): the embedding's and the head's ranks add their
// gradients of the shared vocabulary matrix, a 2-rank ring all-reduce over the stage link.
double TiedSumMs(const GPT2Config& model, const ProjectionOptions& options);

// Per (gpus, kind), the row with the shortest step (ties: more reclaimed).
std::vector<ProjectionRow> BestRows(const Projection& projection);

std::string ProjectionMarkdown(const GPT2Config& model, const Projection& projection,
                               const ProjectionOptions& options);
std::string ProjectionCsv(const Projection& projection);
std::string ProjectionJson(const Projection& projection);
// Two panels against GPU count (log scale), one line per kind, the fastest layout each: bubble
// fraction of GPU time, and reclaimed GPU-equivalents.
std::string ProjectionSvg(const Projection& projection);

}  // namespace freeride
