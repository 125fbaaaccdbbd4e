#include "freeride/tasks/task_model.h"

#include "absl/strings/str_format.h"
#include "core/device.h"
#include "models/device_memory_plan.h"

namespace freeride {

absl::StatusOr<BackendOptions> ReadTaskBackend(const std::string& task, const ArgReader& args) {
  auto device = args.Choice("device", "cpu", {"cpu", "cuda"});
  if (!device.ok()) return device.status();
  auto precision = args.Choice("precision", "fp32", {"fp32", "bf16"});
  if (!precision.ok()) return precision.status();
  if (*device == "cuda" && !CudaBackendBuilt()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "side task '%s': device = \"cuda\", but this build has no CUDA backend", task));
  }
  if (*device == "cpu" && *precision != "fp32") {
    return absl::InvalidArgumentError(absl::StrFormat(
        "side task '%s': precision = \"%s\" needs device = \"cuda\"", task, *precision));
  }
  BackendOptions backend;
  backend.device = *device;
  backend.precision = *precision;
  backend.device_index = NodeLocalRank();
  backend.low_priority = true;
  return backend;
}

absl::StatusOr<std::unique_ptr<StageModel>> MakeTaskModel(SideTaskContext& ctx,
                                                         const BackendOptions& backend,
                                                         const GPT2Config& config,
                                                         int64_t batch, int64_t seq_len) {
  const StageSpec whole = WholeModel(config);
  if (backend.device == "cuda") {
    MemoryPlan plan;
    PlanStageMemory(config, whole, batch, seq_len, 1, backend.precision == "bf16" ? 2 : 4, &plan,
                    !backend.inference_only);
    if (ctx.arena->cap() > 0 && plan.TotalBytes() > ctx.arena->cap()) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "side task '%s' needs %d bytes of device memory (%s), above its memory_limit of %d",
          ctx.name, plan.TotalBytes(), plan.Report(), ctx.arena->cap()));
    }
  } else {
    const int64_t bytes = 4 * NumParameters(config) * static_cast<int64_t>(sizeof(float));
    absl::StatusOr<void*> reserved =
        ctx.arena->Allocate(bytes, "the task model's parameters, gradients and moments");
    if (!reserved.ok()) return reserved.status();
  }
  return MakeStageModel(backend, config, whole, batch, seq_len, 1);
}

}  // namespace freeride
