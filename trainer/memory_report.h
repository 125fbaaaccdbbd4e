// What a config's run would hold in device memory on the CUDA backend, per pipeline stage, from
// the same plan the backend allocates by (models/device_memory_plan.h): for choosing a
// micro-batch size, a split or a precision before reaching a GPU. `freeride config memory`
// (which adds the CPU backend's host memory for a CPU run).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "models/device_memory_plan.h"
#include "models/gpt2_config.h"
#include "trainer/config/config.h"

namespace freeride {

// The model a config describes, in one line: its family and shape, its parameters (the padded
// vocabulary rows included, as the checkpoint holds them), the training FLOPs per token at
// train.seq_len (TrainingFlopsPerToken: 6 × matrix-product parameters + attention's 12·L·C·T),
// and the activations one micro-batch sends across each stage boundary (micro-batch × T ×
// n_embd values, in the messages' type). For every family; `config memory` starts with it.
absl::StatusOr<std::string> ModelSummary(const Config& config);

// One header line, then one line per stage: its layers, what it holds, activation slots (the
// schedule's buffers) and the plan by phase.
absl::StatusOr<std::string> DeviceMemoryReport(const Config& config);

// ZeRO-1 (parallel.zero = 1): the parameters data-parallel rank `member` of `dp` keeps AdamW
// moments for in a chunk of `spec` (pipeline::SplitForZero's share).
int64_t ZeroShareElements(const GPT2Config& model, const StageSpec& spec, int dp, int member);
// What a CUDA chunk of `spec` plans for its optimizer on data-parallel rank `member` under
// `config` (models/device_memory_plan.h): the share's moments and AdamW table with
// parallel.zero = 1 and dp > 1, else the whole moments.
OptimizerShare CudaOptimizerShare(const Config& config, const GPT2Config& model,
                                  const StageSpec& spec, int member);

// The same for the CPU backend's host memory per rank (models/backend.h's PlanCpuStageMemory,
// what the trainer checks before allocating): one header line, then per stage its
// recomputation (model.recompute, parallel.recompute_stages), what each activation slot holds,
// the recomputation's scratch that the slots share, the AdamW moments a rank holds (with
// parallel.zero = 1 and dp > 1 the largest rank's share) and the stage's total.
// Each stage's line ends with the rank's peak (trainer/rank_memory.h): that total with the
// process's baseline, the message buffers, the batch and MPI's temporaries.
absl::StatusOr<std::string> HostMemoryReport(const Config& config);

// What each stage leaves to side work (trainer/rank_memory.h): one header line naming the
// device's memory and runtime.memory_fraction, then per stage training's planned peak and the
// room left.
absl::StatusOr<std::string> SideWorkReport(const Config& config);

}  // namespace freeride
