// A side task's own GPT on the backend its arguments name (`device`, `precision`): the
// arguments and their checks, and the model held to the task's memory_limit before it exists
// (on the CPU its parameters, gradients and moments are reserved in the task's arena; on a GPU
// its device-memory plan is compared with the cap, as the CUDA chunk allocates for itself).
// Side models run on the lowest-priority CUDA stream.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "freeride/side_task.h"
#include "models/backend.h"

namespace freeride {

// Reads args.device ("cpu" | "cuda") and args.precision ("fp32" | "bf16", cuda only).
absl::StatusOr<BackendOptions> ReadTaskBackend(const std::string& task, const ArgReader& args);

// The model for `batch` sequences of `seq_len` tokens, within ctx's memory limit.
absl::StatusOr<std::unique_ptr<StageModel>> MakeTaskModel(SideTaskContext& ctx,
                                                         const BackendOptions& backend,
                                                         const GPT2Config& config,
                                                         int64_t batch, int64_t seq_len);

}  // namespace freeride
