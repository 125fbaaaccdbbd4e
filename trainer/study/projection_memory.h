// `freeride project`'s memory table: what each pipeline stage of a projected layout would hold
// in device memory on the CUDA backend, with and without each memory option (model.recompute
// none / selective / full, parallel.zero 0 / 1), and what that leaves free for side work on a
// GPU of a given size. From the CUDA chunk's own plan (models/device_memory_plan.h: the
// buffers it allocates for the stage's layers, micro-batch, sequence length and activation
// slots), planned under the option's recompute mode, so that the table and the chunk's
// start-up check count the same buffers:
//   recompute  the plan's (StageBufferIds::recompute): what each slot keeps (selective remakes
//              the activation output in the workspace's MLP scratch) and, under full, the one
//              micro-batch's recomputed buffers the slots share.
//   ZeRO-1     AdamW's m and v, and in bf16 the fp32 master copy, for the largest share of the
//              stage's parameters any of its dp ranks holds (pipeline::SplitForZero's shares,
//              cut at the gradient norm's 65,536-element chunks: about 1/dp); the compute copy
//              and the gradients stay whole.
// docs/scale.md#memory-per-stage says how to read the table.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/gpt2_config.h"
#include "models/recompute.h"
#include "trainer/study/projection.h"

namespace freeride {

struct MemoryOption {
  Recompute recompute = Recompute::kNone;
  bool zero = false;
};
// none, none + ZeRO-1, selective, selective + ZeRO-1, full, full + ZeRO-1.
std::vector<MemoryOption> AllMemoryOptions();
std::string MemoryOptionName(const MemoryOption& option);  // "selective + ZeRO-1"

struct StageDeviceMemory {
  int64_t parameters = 0;   // fp32 master (ZeRO-1 in bf16: the share's) + bf16 compute copy
  int64_t gradients = 0;    // fp32, whole
  int64_t optimizer = 0;    // AdamW m and v, fp32 (ZeRO-1: the largest share's)
  int64_t activations = 0;  // the plan's: every slot's, and full recomputation's shared buffers
  int64_t workspace = 0;    // the plan's, shared by the slots
  int64_t reserve = 0;      // what a rank keeps free beyond its plan (cuda::kDeviceHeadroomBytes)
  int64_t total() const {
    return parameters + gradients + optimizer + activations + workspace + reserve;
  }
};

// The most parameters of a stage made of `chunks` any of its `dp` ZeRO-1 ranks keeps optimizer
// state for (all of them at dp = 1).
int64_t LargestZeroShare(const GPT2Config& model, const std::vector<StageSpec>& chunks, int64_t dp);

// A stage holding `chunks` (each with `slots` micro-batches in flight, as the CUDA chunk plans
// them), micro-batch B, sequence length T, `compute_bytes` per weight and activation (2: bf16,
// 4: fp32), `dp` data-parallel replicas, under `option`.
StageDeviceMemory PlanProjectedStage(const GPT2Config& model, const std::vector<StageSpec>& chunks,
                                     int slots, int64_t micro_batch, int64_t seq_len,
                                     int compute_bytes, int64_t dp, const MemoryOption& option);

// The table of `project`'s Markdown: for the fastest layout of each (GPU count, kind), each
// stage's total under every option and what it leaves free of options.device_gib (negative:
// it does not fit).
std::string ProjectionMemoryMarkdown(const GPT2Config& model, const Projection& projection,
                                     const ProjectionOptions& options);

}  // namespace freeride
