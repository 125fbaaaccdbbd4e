#include "models/backend.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/cpu_stage_model.h"
#ifdef FREERIDE_WITH_CUDA
#include "models/cuda/cuda_stage_model.h"
#endif

namespace freeride {

bool CudaBackendBuilt() {
#ifdef FREERIDE_WITH_CUDA
  return true;
#else
  return false;
#endif
}

MessageType MessageTypeOf(const BackendOptions& options) {
  return options.device == "cuda" && options.precision == "bf16" ? MessageType::kBf16
                                                                 : MessageType::kFp32;
}

std::vector<HostBuffer> PlanCpuStageMemory(const GPT2Config& config, const StageSpec& stage,
                                           int64_t micro_batch, int64_t seq_len, int slots,
                                           Recompute recompute, int64_t moment_elements) {
  std::vector<HostBuffer> plan =
      config.is_llama()
          ? PlanLlamaStageMemory(config, stage, micro_batch, seq_len, slots, sizeof(float),
                                 recompute)
          : PlanGPT2StageMemory(config, stage, micro_batch, seq_len, slots, sizeof(float),
                                recompute);
  const bool share = moment_elements >= 0;
  plan.push_back({share ? "AdamW moments (ZeRO-1 share)" : "AdamW moments",
                  2 * (share ? moment_elements : MakeParamLayout(config, stage).total) *
                      static_cast<int64_t>(sizeof(float))});
  return plan;
}

absl::StatusOr<std::unique_ptr<StageModel>> MakeStageModel(const BackendOptions& options,
                                                           const GPT2Config& config,
                                                           const StageSpec& stage,
                                                           int64_t micro_batch, int64_t seq_len,
                                                           int slots) {
  if (options.device == "cpu") {
    if (options.precision != "fp32") {
      return absl::InvalidArgumentError(absl::StrFormat(
          "precision \"%s\" on the cpu device: the CPU backend computes in fp32",
          options.precision));
    }
    try {
      if (config.is_llama()) {
        return std::unique_ptr<StageModel>(std::make_unique<CpuLlamaStageModel>(
            config, stage, micro_batch, seq_len, slots, options.recompute));
      }
      return std::unique_ptr<StageModel>(
          std::make_unique<CpuStageModel>(config, stage, micro_batch, seq_len, slots,
                                          options.recompute));
    } catch (const std::bad_alloc&) {
      const std::vector<HostBuffer> plan =
          PlanCpuStageMemory(config, stage, micro_batch, seq_len, slots, options.recompute);
      return absl::ResourceExhaustedError(absl::StrFormat(
          "out of host memory allocating the CPU model chunk (layers %d..%d, %d slots of %d x %d "
          "tokens): it needs %s",
          stage.first_layer, stage.last_layer, slots, micro_batch, seq_len,
          FormatBytes(TotalBytes(plan))));
    }
  }
  if (options.device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrFormat("device \"%s\": expected \"cpu\" or \"cuda\"", options.device));
  }
#ifdef FREERIDE_WITH_CUDA
  CudaStageOptions cuda;
  cuda.device_index = options.device_index;
  cuda.precision = options.precision == "bf16" ? CudaPrecision::kBf16 : CudaPrecision::kFp32;
  absl::StatusOr<cuda::GeluFusionMode> fuse_gelu = cuda::ParseGeluFusionMode(options.fuse_gelu);
  if (!fuse_gelu.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("runtime.", fuse_gelu.status().message()));
  }
  cuda.fuse_gelu = *fuse_gelu;
  absl::StatusOr<cuda::AttentionMode> attention = cuda::ParseAttentionMode(options.attention);
  if (!attention.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("runtime.", attention.status().message()));
  }
  cuda.attention = *attention;
  absl::StatusOr<cuda::KernelMode> kernels = cuda::ParseKernelMode(options.kernels);
  if (!kernels.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("runtime.", kernels.status().message()));
  }
  cuda.kernels = *kernels;
  cuda.low_priority = options.low_priority;
  cuda.inference_only = options.inference_only;
  cuda.recompute = options.recompute;
  cuda.device_messages = options.device_messages;
  cuda.zero_share = options.zero_share;
  cuda.zero_host_gather = options.zero_host_gather;
  absl::StatusOr<std::unique_ptr<CudaStageModel>> m =
      CudaStageModel::Create(config, stage, micro_batch, seq_len, slots, cuda);
  if (!m.ok()) {
    return absl::Status(m.status().code(),
                        absl::StrCat("runtime.device = \"cuda\": ", m.status().message()));
  }
  return std::unique_ptr<StageModel>(*std::move(m));
#else
  return absl::FailedPreconditionError(
      "runtime.device = \"cuda\", but this build has no CUDA backend: nvcc was not found when "
      "it was configured (rebuild with -DFREERIDE_CUDA=ON and the CUDA toolkit installed)");
#endif
}

}  // namespace freeride
