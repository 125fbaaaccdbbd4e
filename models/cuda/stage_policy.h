// Decisions of the CUDA backend that need no GPU to make, kept apart from the CUDA code so that
// CPU tests hold them: when the GELU rides in cuBLASLt's epilogue, the pointer alignments
// cuBLASLt is told about and the key its algorithms are cached under, whether every launch is
// checked, how a launch site is named in an error, and how much device memory a chunk needs
// free beyond its plan.
#pragma once

#include <compare>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace freeride::cuda {

// runtime.fuse_gelu: "auto" fuses in bf16 only. In fp32 the GPU tests hold the model to 1e-5
// of the CPU, and cuBLASLt may have no fp32 GELU_AUX/DGELU algorithm at all, so fp32 runs the
// separate GELU kernels unless asked.
enum class GeluFusionMode { kAuto, kOn, kOff };
absl::StatusOr<GeluFusionMode> ParseGeluFusionMode(absl::string_view text);
bool FuseGelu(GeluFusionMode mode, bool bf16);

// runtime.attention: "auto" runs the flash kernels (flash_attention.h) in bf16 where
// flash::ShapeSupported (head sizes 16, 32, 64 and 128, any T), and the reference path (heads
// split out, batched GEMMs over the T × T scores, softmax kernels) in fp32 and for other shapes;
// "reference" runs the reference path always (what the GPU tests hold the flash kernels to, and
// a way around them).
enum class AttentionMode { kAuto, kReference };
absl::StatusOr<AttentionMode> ParseAttentionMode(absl::string_view text);
bool UseFlashAttention(AttentionMode mode, bool bf16, int64_t B, int64_t NH, int64_t hs, int64_t T);
// OK when the device's opt-in shared memory per block (`optin_bytes`,
// cudaDevAttrMaxSharedMemoryPerBlockOptin) holds the flash kernels of head size `hs`; else
// FailedPrecondition naming both figures and runtime.attention = "reference". The kernels are
// sized for the A100 and H100; a card with less (99 KiB on sm_86/sm_89) cannot launch hs 128's.
absl::Status CheckFlashSharedMemory(int64_t hs, int64_t optin_bytes, int device);

// runtime.kernels: "auto" runs the fused memory-bound kernels (vectorised LayerNorm with the
// residual folded in, one-pass classifier, multi-tensor optimizer); "reference" runs the
// kernels of kernels.h one operation at a time: what the GPU tests hold the fused ones to,
// the other arm of the GPU bench, and a way around them.
enum class KernelMode { kAuto, kReference };
absl::StatusOr<KernelMode> ParseKernelMode(absl::string_view text);
// Whether a chunk of B·T = `rows` rows of width C runs the fused kernels (layernorm.h,
// column_sums.h, elementwise.h): "auto" and a shape they take (vec::Supported: C a multiple
// of the 16-byte vector, 32-bit indices, C ≤ 2048 in bf16 and 1024 in fp32); else the reference.
bool UseFusedKernels(KernelMode mode, int64_t rows, int64_t C, int element_bytes);

// The largest power of two, at most 256, that divides the address: what cuBLASLt's
// MIN_ALIGNMENT preferences want (its heuristic otherwise assumes 256-byte pointers and may
// pick a kernel that faults on the 64-byte-aligned tensors of a small model). Null: 256.
uint32_t PointerAlignment(const void* p);

// Everything cuBLASLt's heuristic answer depends on for one handle and workspace.
struct LtKey {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldd = 0;
  int a_type = 0, b_type = 0, d_type = 0, epilogue = 0;
  bool bias = false, accumulate = false;
  uint32_t align_a = 0, align_b = 0, align_d = 0;
  auto operator<=>(const LtKey&) const = default;
};

// FREERIDE_CUDA_CHECK_LAUNCHES: "1" checks for an error and synchronises after every kernel
// and library call (the error then names the call and its layer, where otherwise it surfaces
// at the next synchronisation with no culprit); unset, "" or "0" does not. Anything else is an
// error naming the variable and its value.
inline constexpr char kCheckLaunchesVariable[] = "FREERIDE_CUDA_CHECK_LAUNCHES";
absl::StatusOr<bool> CheckLaunchesFromEnvironment();

// Launch sites that are not one transformer block.
inline constexpr int64_t kEmbedding = -1;
inline constexpr int64_t kHead = -2;
inline constexpr int64_t kWholeChunk = -3;
// "LayerNormForward in layer 7" (the model's layer index: first_layer + local), "… in the
// embedding", "… in the head", "… on the whole chunk".
std::string LaunchSite(absl::string_view call, int64_t local_layer, int64_t first_layer);

// Device memory beyond the plan that a chunk leaves free, for what is allocated after the check
// and cannot be measured before it: kernel modules loaded lazily at their first launch
// (CUDA_MODULE_LOADING=LAZY, the default), cuBLAS's and cuBLASLt's per-algorithm state, and an
// NCCL communicator made later on the same device (its channels' buffers: NCCL_BUFFSIZE, 4 MiB,
// per channel and peer). The context, streams and library handles are made before the check and
// so are measured, not estimated.
inline constexpr int64_t kDeviceHeadroomBytes = int64_t{512} << 20;
// OK when `planned` bytes plus the headroom fit in `free_bytes`; else ResourceExhausted naming
// the device, both figures and the plan (`plan_report`).
absl::Status CheckDeviceMemory(int64_t planned, uint64_t free_bytes, int device,
                               const std::string& plan_report);

}  // namespace freeride::cuda
