// What compute this process can see: the CPU always, CUDA devices when the backend is built
// and a driver is present. Discovery never fails: without a driver (or with CUDA hidden), the
// CUDA list is empty, `cuda_unavailable` says why in a person's words and `cuda_detail` holds
// the runtime's own error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace freeride {

enum class DeviceKind { kCpu, kCuda };

struct DeviceInfo {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;
  std::string name;
  uint64_t total_memory_bytes = 0;
  uint64_t free_memory_bytes = 0;
  int compute_capability_major = 0;  // CUDA only
  int compute_capability_minor = 0;
  int parallel_units = 0;  // CPU: hardware threads; CUDA: streaming multiprocessors
};

struct DeviceInventory {
  DeviceInfo cpu;
  std::vector<DeviceInfo> cuda;
  bool cuda_built = false;
  std::string cuda_unavailable;  // empty when at least one CUDA device is usable
  std::string cuda_detail;       // the CUDA runtime's error behind it, if any
};

DeviceInventory DiscoverDevices();

// Why no CUDA device is usable, from the name of the CUDA runtime's error
// ("cudaErrorInsufficientDriver"): "no NVIDIA driver: CPU only", "no CUDA device visible: CPU
// only", ... A machine without a GPU is a normal place to run, not a failure.
std::string CudaUnavailableReason(const std::string& error_name);

// This process's rank among those on its node, from the launcher's environment (Open MPI's
// OMPI_COMM_WORLD_LOCAL_RANK, Slurm's SLURM_LOCALID, torchrun-style LOCAL_RANK); 0 when none
// is set. Ranks on one node take CUDA devices round-robin by it.
int NodeLocalRank();
// Ranks of the job on this node, from the same launchers' variables (1 when none is set).
int NodeLocalSize();

// One line: "cuda:0 NVIDIA H100 80GB HBM3, sm_90, 132 SMs, 79.1 GiB (78.5 GiB free)".
std::string DescribeDevice(const DeviceInfo& device);

}  // namespace freeride
