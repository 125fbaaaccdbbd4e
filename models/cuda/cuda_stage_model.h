// The CUDA backend behind the StageModel interface: one model chunk on one GPU, fp32 or bf16
// (bf16 weights and activations; fp32 master weights, gradients and AdamW state). Its device
// memory is planned up front (models/device_memory_plan.h), allocated once per phase, and
// reported when it is created; nothing is allocated inside a step.
//
// Every public call first makes the chunk's device current (a rank may hold chunks, or side
// tasks' models, on more than one device, and CUDA's current device is per thread). With
// FREERIDE_CUDA_CHECK_LAUNCHES=1 every kernel and library call is checked and synchronised, and
// its error names the call and the layer (stage_policy.h).
//
// Work runs on the chunk's own stream. The calls whose results stay on the device
// (ForwardKeepingLoss, BackwardInput, BackwardWeight, ZeroGrads, FoldHeadWteGrad, SetTokens and
// SetTargets, which copy through the slot's pinned staging) return once their work is queued;
// the host waits for the stream only where it reads (Forward's loss, TakeLosses, GetLosses,
// HostGrads, GradSquaresByUnit, messages, checkpoints), in Drain (the pipeline's timeline and
// its BUBBLE instructions: StageExecutor::set_exact_timeline), and at the end of ApplyAdamW (a
// step's end: the step's time is the device's). A launch's error comes back from the call that
// launched it; a fault while the kernel runs, from the next call that waits.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "models/cuda/stage_policy.h"
#include "models/device_memory_plan.h"
#include "models/stage_model.h"

namespace freeride {

// What a chunk has asked of the device since it was made (cumulative: a caller takes
// differences per step): kernel and library launches (each FR_KERNEL and FR_LIBRARY), host
// waits for the device (stream or event synchronisations), device and pinned allocations.
struct CudaLedger {
  int64_t launches = 0, syncs = 0, allocations = 0;
};

enum class CudaPrecision { kFp32, kBf16 };

struct CudaStageOptions {
  int device_index = 0;  // taken modulo the number of visible devices
  CudaPrecision precision = CudaPrecision::kFp32;
  // The GELU inside cuBLASLt's epilogue (forward GELU_AUX_BIAS, backward DGELU), or separate
  // kernels (the reference the GPU tests hold the fused path to); auto: fused in bf16 only
  // (stage_policy.h says why).
  cuda::GeluFusionMode fuse_gelu = cuda::GeluFusionMode::kAuto;
  // The flash kernels in bf16 where their shapes fit, else the reference path (runtime.attention,
  // stage_policy.h).
  cuda::AttentionMode attention = cuda::AttentionMode::kAuto;
  // The fused memory-bound kernels, or the one-operation-at-a-time reference (runtime.kernels,
  // stage_policy.h).
  cuda::KernelMode kernels = cuda::KernelMode::kAuto;
  // The chunk's stream at the device's lowest priority (side work), else its highest
  // (training).
  bool low_priority = false;
  // Forward only (inference): no memory for gradients, optimizer state or backward; the
  // training calls return FailedPrecondition.
  bool inference_only = false;
  // What a micro-batch in flight keeps for its backward (model.recompute; what each mode
  // drops on this backend: StageBufferIds in models/device_memory_plan.h). Losses and
  // gradients are the same bits in every mode. No effect with inference_only.
  Recompute recompute = Recompute::kNone;
  // Messages the chunk will hand out in device memory (AllocateMessageBuffer for a transport
  // that carries it, NCCL's: the stage executor's, StageExecutor::MessageBuffersOf), counted
  // in the start-up memory check with the plan.
  int64_t device_messages = 0;
  // ZeRO-1 (parallel.zero = 1): the chunk's share (StageModel::ShardOptimizerState's ranges),
  // planned and allocated sharded from the start, so that the start-up memory check asks for
  // the share's moments (and in bf16 its fp32 master) only; ShardOptimizerState with the same
  // ranges then confirms it. Unset: whole, until ShardOptimizerState.
  std::optional<std::vector<ParamRange>> zero_share = std::nullopt;
  // ZeRO-1's all-gather goes through host memory (MPI): the pinned host copies HostParams
  // hands out. False over a transport that carries device memory (NCCL), which gathers in
  // place on the device and needs none.
  bool zero_host_gather = true;
};

class CudaStageModel : public StageModel {
 public:
  static absl::StatusOr<std::unique_ptr<CudaStageModel>> Create(const GPT2Config& config,
                                                                const StageSpec& stage,
                                                                int64_t micro_batch,
                                                                int64_t seq_len, int slots,
                                                                const CudaStageOptions& options);
  virtual cudaStream_t stream() const = 0;
  virtual int device() const = 0;
  virtual const MemoryPlan& memory_plan() const = 0;
  // Per-token losses [B·T] of the slot's last Forward (head stage), in host memory.
  virtual absl::Status GetLosses(int slot, float* losses) = 0;
  virtual CudaLedger ledger() const = 0;
};

}  // namespace freeride
