#include "models/cuda/stage_policy.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/cuda/flash_tile.h"
#include "models/cuda/vector_geometry.h"

namespace freeride::cuda {

absl::StatusOr<GeluFusionMode> ParseGeluFusionMode(absl::string_view text) {
  if (text == "auto") return GeluFusionMode::kAuto;
  if (text == "on") return GeluFusionMode::kOn;
  if (text == "off") return GeluFusionMode::kOff;
  return absl::InvalidArgumentError(
      absl::StrCat("fuse_gelu \"", text, "\": expected \"auto\", \"on\" or \"off\""));
}

bool FuseGelu(GeluFusionMode mode, bool bf16) {
  switch (mode) {
    case GeluFusionMode::kOn:
      return true;
    case GeluFusionMode::kOff:
      return false;
    case GeluFusionMode::kAuto:
      break;
  }
  return bf16;
}

absl::StatusOr<AttentionMode> ParseAttentionMode(absl::string_view text) {
  if (text == "auto") return AttentionMode::kAuto;
  if (text == "reference") return AttentionMode::kReference;
  return absl::InvalidArgumentError(
      absl::StrCat("attention \"", text, "\": expected \"auto\" or \"reference\""));
}

absl::StatusOr<KernelMode> ParseKernelMode(absl::string_view text) {
  if (text == "auto") return KernelMode::kAuto;
  if (text == "reference") return KernelMode::kReference;
  return absl::InvalidArgumentError(
      absl::StrCat("kernels \"", text, "\": expected \"auto\" or \"reference\""));
}

bool UseFusedKernels(KernelMode mode, int64_t rows, int64_t C, int element_bytes) {
  return mode == KernelMode::kAuto && vec::Supported(rows, C, element_bytes);
}

bool UseFlashAttention(AttentionMode mode, bool bf16, int64_t B, int64_t NH, int64_t hs,
                       int64_t T) {
  return mode == AttentionMode::kAuto && bf16 && flash::ShapeSupported(B, NH, hs, T);
}

absl::Status CheckFlashSharedMemory(int64_t hs, int64_t optin_bytes, int device) {
  int64_t needed = 0;
  for (flash::Kernel k :
       {flash::Kernel::kForward, flash::Kernel::kBackwardKv, flash::Kernel::kBackwardQ}) {
    needed = std::max(needed, flash::Layout(k, hs).bytes);
  }
  if (needed <= optin_bytes) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "cuda:%d offers %d KiB of shared memory per block, and the flash attention kernels of "
      "head size %d need %d KiB: set runtime.attention = \"reference\"",
      device, optin_bytes / 1024, hs, (needed + 1023) / 1024));
}

uint32_t PointerAlignment(const void* p) {
  constexpr uint32_t kMax = 256;
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 1;
  while (alignment < kMax && address % (alignment * 2) == 0) alignment *= 2;
  return alignment;
}

absl::StatusOr<bool> CheckLaunchesFromEnvironment() {
  const char* value = std::getenv(kCheckLaunchesVariable);
  if (value == nullptr || absl::string_view(value).empty() || absl::string_view(value) == "0") {
    return false;
  }
  if (absl::string_view(value) == "1") return true;
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s=\"%s\": expected 1 (check every launch) or 0", kCheckLaunchesVariable, value));
}

std::string LaunchSite(absl::string_view call, int64_t local_layer, int64_t first_layer) {
  switch (local_layer) {
    case kEmbedding:
      return absl::StrCat(call, " in the embedding");
    case kHead:
      return absl::StrCat(call, " in the head");
    case kWholeChunk:
      return absl::StrCat(call, " on the whole chunk");
    default:
      return absl::StrCat(call, " in layer ", first_layer + local_layer);
  }
}

absl::Status CheckDeviceMemory(int64_t planned, uint64_t free_bytes, int device,
                               const std::string& plan_report) {
  const uint64_t needed = static_cast<uint64_t>(planned + kDeviceHeadroomBytes);
  if (needed <= free_bytes) return absl::OkStatus();
  constexpr double kGiB = 1 << 30;
  return absl::ResourceExhaustedError(absl::StrFormat(
      "the model chunk needs %.2f GiB of device memory on cuda:%d (%.2f GiB planned + %.2f GiB "
      "kept for lazily loaded kernels, library state and NCCL), %.2f GiB are free after the "
      "context and library handles (%s); lower train.batch_size or raise train.microbatches",
      needed / kGiB, device, planned / kGiB, kDeviceHeadroomBytes / kGiB, free_bytes / kGiB,
      plan_report));
}

}  // namespace freeride::cuda
