// The CUDA runtime of the emulation build, but for streams and events (streams.cc): one device
// whose memory is host memory, pinned memory, copies, the launch errors a real runtime reports
// and the device's properties.
#include "models/cuda/emulation/runtime.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include "models/cuda/emulation/include/cuda_runtime_api.h"

namespace freeride::emu {
namespace {

constexpr size_t kDefaultSharedBytes = 48 << 10;
constexpr size_t kOptinSharedBytes = 227 << 10;  // sm_90's opt-in limit per block

struct Device {
  std::mutex mu;
  std::map<const char*, size_t> allocations;  // cudaMalloc: start → bytes
  std::set<const void*> pinned;
  size_t allocated = 0;
  std::unordered_map<const void*, size_t> max_shared;  // cudaFuncSetAttribute
  std::map<size_t, int64_t> host_device_copies;        // bytes → copies (HostDeviceCopies)
  std::map<size_t, int64_t> device_to_host_copies;     // the same, device to host only
};
Device& TheDevice() {
  static Device* device = new Device;  // outlives every static destructor that frees memory
  return *device;
}

thread_local cudaError_t last_error = cudaSuccess;

size_t TotalMemory() {
  static const size_t total = [] {
    const char* gib = std::getenv("FREERIDE_EMULATE_MEMORY_GIB");
    const double value = gib == nullptr ? 16.0 : std::atof(gib);
    return static_cast<size_t>((value > 0 ? value : 16.0) * (size_t{1} << 30));
  }();
  return total;
}

bool DeviceHidden() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return visible != nullptr && (visible[0] == '\0' || visible[0] == '-');
}

bool IsPinned(const void* p) {
  Device& d = TheDevice();
  std::lock_guard<std::mutex> lock(d.mu);
  return d.pinned.count(p) > 0;
}

// The kinds name which side is device memory; a wrong kind is an error, not a guess.
bool KindMatches(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return true;
  switch (kind) {
    case cudaMemcpyHostToDevice:
      return IsDeviceMemory(dst, bytes);
    case cudaMemcpyDeviceToHost:
      return IsDeviceMemory(src, bytes);
    case cudaMemcpyDeviceToDevice:
      return IsDeviceMemory(dst, bytes) && IsDeviceMemory(src, bytes);
    case cudaMemcpyHostToHost:
    case cudaMemcpyDefault:
      return true;
  }
  return false;
}

// cudaMemcpyDefault: the kind the pointers say, as unified addressing lets CUDA infer it.
cudaMemcpyKind Resolved(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (kind != cudaMemcpyDefault) return kind;
  const bool to_device = IsDeviceMemory(dst, bytes), from_device = IsDeviceMemory(src, bytes);
  if (to_device) return from_device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice;
  return from_device ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost;
}

std::atomic<double> device_copy_delay_s{0};  // SetDeviceCopyDelay

void CountCopy(size_t bytes, cudaMemcpyKind kind) {
  if (kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToHost) return;
  Device& d = TheDevice();
  std::lock_guard<std::mutex> lock(d.mu);
  ++d.host_device_copies[bytes];
  if (kind == cudaMemcpyDeviceToHost) ++d.device_to_host_copies[bytes];
}

}  // namespace

bool IsDeviceMemory(const void* p, size_t bytes) {
  Device& d = TheDevice();
  std::lock_guard<std::mutex> lock(d.mu);
  const char* c = static_cast<const char*>(p);
  auto it = d.allocations.upper_bound(c);
  if (it == d.allocations.begin()) return false;
  --it;
  return c >= it->first && c + bytes <= it->first + it->second;
}

void SetLastError(cudaError_t error) { last_error = error; }

int64_t HostDeviceCopies(size_t bytes) {
  Device& d = TheDevice();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.host_device_copies.find(bytes);
  return it == d.host_device_copies.end() ? 0 : it->second;
}

void SetDeviceCopyDelay(double seconds) { device_copy_delay_s = seconds > 0 ? seconds : 0; }

std::map<size_t, int64_t> DeviceToHostCopies() {
  Device& d = TheDevice();
  std::lock_guard<std::mutex> lock(d.mu);
  return d.device_to_host_copies;
}

size_t MaxDynamicSharedBytes(const void* kernel) {
  Device& d = TheDevice();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.max_shared.find(kernel);
  return it == d.max_shared.end() ? kDefaultSharedBytes : it->second;
}

}  // namespace freeride::emu

using freeride::emu::Device;
using freeride::emu::TheDevice;

namespace freeride::emu {
namespace {

// The runtime's name and text of each error this emulation returns.
struct ErrorText {
  cudaError_t code;
  const char* name;
  const char* text;
};
const ErrorText* FindError(cudaError_t error) {
  static constexpr ErrorText kErrors[] = {
      {cudaSuccess, "cudaSuccess", "no error"},
      {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
      {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
      {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
       "invalid configuration argument"},
      {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
      {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
       "CUDA driver version is insufficient for CUDA runtime version"},
      {cudaErrorDevicesUnavailable, "cudaErrorDevicesUnavailable",
       "CUDA-capable device(s) is/are busy or unavailable"},
      {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
      {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
      {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
      {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
      {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources",
       "too many resources requested for launch"},
      {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
  };
  for (const ErrorText& e : kErrors) {
    if (e.code == error) return &e;
  }
  return nullptr;
}

}  // namespace
}  // namespace freeride::emu

const char* cudaGetErrorName(cudaError_t error) {
  const freeride::emu::ErrorText* e = freeride::emu::FindError(error);
  return e != nullptr ? e->name : "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t error) {
  const freeride::emu::ErrorText* e = freeride::emu::FindError(error);
  return e != nullptr ? e->text : "unknown error";
}

cudaError_t cudaGetLastError() {
  const cudaError_t error = freeride::emu::last_error;
  freeride::emu::last_error = cudaSuccess;
  return error;
}
cudaError_t cudaPeekAtLastError() { return freeride::emu::last_error; }

// The toolkit the project targets; the "driver" is this emulator.
cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = 13000;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* version) {
  *version = 13000;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = freeride::emu::DeviceHidden() ? 0 : 1;
  return *count == 0 ? cudaErrorNoDevice : cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  return device == 0 && !freeride::emu::DeviceHidden() ? cudaSuccess : cudaErrorInvalidDevice;
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  *prop = {};
  std::snprintf(prop->name, sizeof prop->name, "freeride CUDA emulator (sm_90 model)");
  prop->totalGlobalMem = freeride::emu::TotalMemory();
  prop->sharedMemPerBlock = freeride::emu::kDefaultSharedBytes;
  prop->sharedMemPerBlockOptin = freeride::emu::kOptinSharedBytes;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  prop->l2CacheSize = 50 << 20;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  cudaDeviceProp prop;
  if (cudaError_t e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess) return e;
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
      *value = prop.maxThreadsPerBlock;
      break;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = static_cast<int>(prop.sharedMemPerBlock);
      break;
    case cudaDevAttrWarpSize:
      *value = prop.warpSize;
      break;
    case cudaDevAttrMultiProcessorCount:
      *value = prop.multiProcessorCount;
      break;
    case cudaDevAttrComputeCapabilityMajor:
      *value = prop.major;
      break;
    case cudaDevAttrComputeCapabilityMinor:
      *value = prop.minor;
      break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(prop.sharedMemPerBlockOptin);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  freeride::emu::DrainAll();
  return cudaSuccess;
}
cudaError_t cudaDeviceReset() { return cudaDeviceSynchronize(); }
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  Device& d = TheDevice();
  std::lock_guard<std::mutex> lock(d.mu);
  *total_bytes = freeride::emu::TotalMemory();
  *free_bytes = *total_bytes - d.allocated;
  return cudaSuccess;
}

// New device memory is NaN everywhere (0xff bytes): a kernel that reads what nobody wrote
// sees it at once instead of the zeros a fresh host page would give.
cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  Device& d = TheDevice();
  {
    std::lock_guard<std::mutex> lock(d.mu);
    if (bytes > freeride::emu::TotalMemory() - d.allocated) {
      *ptr = nullptr;
      return cudaErrorMemoryAllocation;
    }
  }
  // 256-byte aligned as cudaMalloc's are, and exactly `bytes` long, so that AddressSanitizer
  // reports an access one past the end.
  void* memory = nullptr;
  if (posix_memalign(&memory, 256, std::max<size_t>(bytes, 1)) != 0) {
    return cudaErrorMemoryAllocation;
  }
  char* p = static_cast<char*>(memory);
  std::memset(p, 0xff, bytes);
  std::lock_guard<std::mutex> lock(d.mu);
  d.allocations[p] = bytes;
  d.allocated += bytes;
  *ptr = p;
  return cudaSuccess;
}
cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  freeride::emu::DrainAll();  // cudaFree synchronises the device
  Device& d = TheDevice();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.allocations.find(static_cast<const char*>(ptr));
  if (it == d.allocations.end()) return cudaErrorInvalidValue;
  d.allocated -= it->second;
  d.allocations.erase(it);
  std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  *ptr = std::aligned_alloc(4096, (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096);
  if (*ptr == nullptr) return cudaErrorMemoryAllocation;
  Device& d = TheDevice();
  std::lock_guard<std::mutex> lock(d.mu);
  d.pinned.insert(*ptr);
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  freeride::emu::DrainAll();
  Device& d = TheDevice();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.pinned.erase(ptr) == 0) return cudaErrorInvalidValue;
  std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  *attributes = {};
  attributes->device = 0;
  if (freeride::emu::IsDeviceMemory(ptr, 1)) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->devicePointer = const_cast<void*>(ptr);
  } else if (freeride::emu::IsPinned(ptr)) {
    attributes->type = cudaMemoryTypeHost;
    attributes->devicePointer = attributes->hostPointer = const_cast<void*>(ptr);
  } else {
    attributes->type = cudaMemoryTypeUnregistered;
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (!freeride::emu::KindMatches(dst, src, bytes, kind)) return cudaErrorInvalidValue;
  freeride::emu::CountCopy(bytes, freeride::emu::Resolved(dst, src, bytes, kind));
  freeride::emu::DrainBlocking();
  std::memcpy(dst, src, bytes);
  return cudaSuccess;
}
// As CUDA does with pageable host memory: the source is staged at the call (the caller may
// reuse it at once) and a copy into pageable memory returns only once done. Pinned memory is
// read and written when the stream gets there, so reusing it early is the race it is.
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (!freeride::emu::KindMatches(dst, src, bytes, kind) || !freeride::emu::ValidStream(stream)) {
    return cudaErrorInvalidValue;
  }
  kind = freeride::emu::Resolved(dst, src, bytes, kind);
  freeride::emu::CountCopy(bytes, kind);
  if (kind == cudaMemcpyHostToDevice && !freeride::emu::IsPinned(src)) {
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + bytes);
    freeride::emu::Enqueue(stream,
                           [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
    return cudaSuccess;
  }
  const double delay =
      kind == cudaMemcpyDeviceToDevice ? freeride::emu::device_copy_delay_s.load() : 0.0;
  freeride::emu::Enqueue(stream, [dst, src, bytes, delay] {
    if (delay > 0) std::this_thread::sleep_for(std::chrono::duration<double>(delay));
    std::memcpy(dst, src, bytes);
  });
  if (kind == cudaMemcpyDeviceToHost && !freeride::emu::IsPinned(dst) && stream != nullptr) {
    cudaStreamSynchronize(stream);
  }
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream) {
  if (width > dpitch || width > spitch || !freeride::emu::ValidStream(stream)) {
    return cudaErrorInvalidValue;
  }
  if (height == 0 || width == 0) return cudaSuccess;
  const size_t dst_span = dpitch * (height - 1) + width, src_span = spitch * (height - 1) + width;
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if ((dst_device && !freeride::emu::IsDeviceMemory(dst, dst_span)) ||
      (src_device && !freeride::emu::IsDeviceMemory(src, src_span))) {
    return cudaErrorInvalidValue;
  }
  freeride::emu::CountCopy(width * height, kind);
  auto copy = [=] {
    for (size_t r = 0; r < height; ++r) {
      std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
                  width);
    }
  };
  freeride::emu::Enqueue(stream, copy);
  if (!dst_device && !freeride::emu::IsPinned(dst) && stream != nullptr) {
    cudaStreamSynchronize(stream);
  }
  return cudaSuccess;
}
cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  if (bytes > 0 && !freeride::emu::IsDeviceMemory(ptr, bytes)) return cudaErrorInvalidValue;
  freeride::emu::DrainBlocking();
  std::memset(ptr, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  if (bytes > 0 && !freeride::emu::IsDeviceMemory(ptr, bytes)) return cudaErrorInvalidValue;
  if (!freeride::emu::ValidStream(stream)) return cudaErrorInvalidValue;
  freeride::emu::Enqueue(stream, [=] { std::memset(ptr, value, bytes); });
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* kernel, cudaFuncAttribute attr, int value) {
  if (kernel == nullptr || attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      static_cast<size_t>(value) > freeride::emu::kOptinSharedBytes) {
    return cudaErrorInvalidValue;
  }
  Device& d = TheDevice();
  std::lock_guard<std::mutex> lock(d.mu);
  d.max_shared[kernel] = static_cast<size_t>(value);
  return cudaSuccess;
}
