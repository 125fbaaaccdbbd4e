// Picks the backend that holds a model chunk: the CPU (fp32) or a CUDA device (fp32 or bf16).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/host_memory.h"
#include "models/recompute.h"
#include "models/stage_model.h"

namespace freeride {

struct BackendOptions {
  std::string device = "cpu";     // "cpu" | "cuda"
  std::string precision = "fp32";  // "fp32" | "bf16" (cuda only)
  int device_index = 0;            // which CUDA device (the node-local rank, mod the count)
  std::string fuse_gelu = "auto";  // runtime.fuse_gelu: "auto" | "on" | "off" (cuda only)
  std::string attention = "auto";  // runtime.attention: "auto" | "reference" (cuda only)
  std::string kernels = "auto";    // runtime.kernels: "auto" | "reference" (cuda only)
  // Side work (a side task's model): on CUDA its stream has the lowest priority, so its
  // kernels yield to training's when they overlap.
  bool low_priority = false;
  // Forward only: on CUDA no memory for gradients, optimizer state or backward (the CPU
  // backend ignores it).
  bool inference_only = false;
  // What the chunk's micro-batches in flight keep for backward (model.recompute and
  // parallel.recompute_stages; models/recompute.h). Both backends, both families.
  Recompute recompute = Recompute::kNone;
  // Messages the chunk will allocate on its device (a transport that carries device memory):
  // on CUDA counted in the start-up memory check.
  int64_t device_messages = 0;
  // ZeRO-1 (parallel.zero = 1): on CUDA the chunk is made with this share of its optimizer
  // state (CudaStageOptions::zero_share), its all-gather through host memory or not
  // (zero_host_gather); the CPU backend shards when ShardOptimizerState asks.
  std::optional<std::vector<ParamRange>> zero_share = std::nullopt;
  bool zero_host_gather = true;
};

// Whether this binary was built with the CUDA backend.
bool CudaBackendBuilt();

// The element type of the messages a chunk made with `options` sends and receives (bf16 on a
// bf16 CUDA chunk, else fp32), known before any chunk exists: the cost of a message.
MessageType MessageTypeOf(const BackendOptions& options);

// The host memory a CPU chunk holds (its GPT2Stage and AdamW moments), without allocating it.
// `moment_elements`: the moments of this many parameters (a ZeRO-1 share); < 0: all of them.
std::vector<HostBuffer> PlanCpuStageMemory(const GPT2Config& config, const StageSpec& stage,
                                           int64_t micro_batch, int64_t seq_len, int slots,
                                           Recompute recompute = Recompute::kNone,
                                           int64_t moment_elements = -1);

// A chunk on the requested backend, or an error saying why it cannot be had: a build without
// the CUDA backend, no usable CUDA device, bf16 on the CPU, too little device memory.
absl::StatusOr<std::unique_ptr<StageModel>> MakeStageModel(const BackendOptions& options,
                                                           const GPT2Config& config,
                                                           const StageSpec& stage,
                                                           int64_t micro_batch, int64_t seq_len,
                                                           int slots);

}  // namespace freeride
