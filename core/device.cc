#include "core/device.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

#ifdef FREERIDE_WITH_CUDA
#include "core/cuda_check.h"
#endif

namespace freeride {
namespace {

std::string CpuModelName() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (absl::StartsWith(line, "model name")) {
      auto colon = line.find(':');
      if (colon != std::string::npos) {
        return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
      }
    }
  }
  return "unknown CPU";
}

DeviceInfo DiscoverCpu() {
  DeviceInfo cpu;
  cpu.kind = DeviceKind::kCpu;
  cpu.name = CpuModelName();
  const long page = sysconf(_SC_PAGESIZE);
  cpu.total_memory_bytes = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * page;
  cpu.free_memory_bytes = static_cast<uint64_t>(sysconf(_SC_AVPHYS_PAGES)) * page;
  cpu.parallel_units = static_cast<int>(std::thread::hardware_concurrency());
  return cpu;
}

#ifdef FREERIDE_WITH_CUDA
// The devices, or the runtime's error; `error_name` is that error's name.
absl::Status DiscoverCuda(std::vector<DeviceInfo>* devices, std::string* error_name) {
  int count = 0;
  if (const cudaError_t error = cudaGetDeviceCount(&count); error != cudaSuccess) {
    *error_name = cudaGetErrorName(error);
    return CudaStatus(error, "cudaGetDeviceCount(&count)", __FILE__, __LINE__);
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, i));
    DeviceInfo device;
    device.kind = DeviceKind::kCuda;
    device.index = i;
    device.name = prop.name;
    device.total_memory_bytes = prop.totalGlobalMem;
    device.compute_capability_major = prop.major;
    device.compute_capability_minor = prop.minor;
    device.parallel_units = prop.multiProcessorCount;
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaSetDevice(i));
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    device.free_memory_bytes = free_bytes;
    devices->push_back(device);
  }
  return absl::OkStatus();
}
#endif

}  // namespace

DeviceInventory DiscoverDevices() {
  DeviceInventory inventory;
  inventory.cpu = DiscoverCpu();
#ifdef FREERIDE_WITH_CUDA
  inventory.cuda_built = true;
  std::string error_name;
  absl::Status status = DiscoverCuda(&inventory.cuda, &error_name);
  if (!status.ok()) {
    inventory.cuda.clear();
    inventory.cuda_unavailable = CudaUnavailableReason(error_name);
    inventory.cuda_detail = std::string(status.message());
  } else if (inventory.cuda.empty()) {
    inventory.cuda_unavailable = CudaUnavailableReason("cudaErrorNoDevice");
  }
#else
  inventory.cuda_unavailable = "this binary was built without the CUDA backend: CPU only";
#endif
  return inventory;
}

std::string CudaUnavailableReason(const std::string& error_name) {
  // A stub libcuda (the toolkit's, for linking) or none at all: the driver is what is missing.
  if (error_name == "cudaErrorInsufficientDriver" || error_name == "cudaErrorStubLibrary") {
    return "no NVIDIA driver: CPU only";
  }
  if (error_name == "cudaErrorNoDevice") {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    return visible != nullptr && (*visible == '\0' || *visible == '-')
               ? "no CUDA device visible (CUDA_VISIBLE_DEVICES hides them): CPU only"
               : "no CUDA device visible: CPU only";
  }
  return absl::StrCat("CUDA unavailable (", error_name.empty() ? "unknown error" : error_name,
                      "): CPU only");
}

std::string DescribeDevice(const DeviceInfo& device) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  if (device.kind == DeviceKind::kCpu) {
    return absl::StrFormat("cpu %s, %d threads, %.1f GiB (%.1f GiB free)", device.name,
                           device.parallel_units, device.total_memory_bytes / kGiB,
                           device.free_memory_bytes / kGiB);
  }
  return absl::StrFormat("cuda:%d %s, sm_%d%d, %d SMs, %.1f GiB (%.1f GiB free)", device.index,
                         device.name, device.compute_capability_major,
                         device.compute_capability_minor, device.parallel_units,
                         device.total_memory_bytes / kGiB, device.free_memory_bytes / kGiB);
}

int NodeLocalRank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && *value != '\0') return std::atoi(value);
  }
  return 0;
}

int NodeLocalSize() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && std::atoi(value) > 0) return std::atoi(value);
  }
  return 1;
}

}  // namespace freeride
