// The NCCL transport's memory: device buffers used as they are, staging for host memory (a
// pinned bounce buffer for pageable memory), the tags that travel ahead of messages, events.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "core/cuda_check.h"
#include "core/status.h"
#include "pipeline/comm/nccl_transport_impl.h"

namespace freeride::pipeline::nccl_internal {

Memory KindOf(const void* p) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    cudaGetLastError();  // an unknown pointer is pageable host memory; clear the error
    return Memory::kPageable;
  }
  if (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged) {
    return Memory::kDevice;
  }
  return attributes.type == cudaMemoryTypeHost ? Memory::kPinned : Memory::kPageable;
}

absl::StatusOr<void*> NcclTransport::Take(std::multimap<int64_t, void*>& pool, int64_t bytes,
                                          bool pinned) {
  auto it = pool.find(bytes);
  if (it != pool.end()) {
    void* p = it->second;
    pool.erase(it);
    return p;
  }
  void* p = nullptr;
  if (pinned) {
    CUDA_CHECK(cudaMallocHost(&p, std::max<int64_t>(bytes, 1)));
  } else {
    CUDA_CHECK(cudaMalloc(&p, std::max<int64_t>(bytes, 1)));
  }
  return p;
}

absl::StatusOr<void*> NcclTransport::Buffer(Pending& p, void* data, int64_t bytes, bool fill,
                                            cudaStream_t stream) {
  const Memory kind = KindOf(data);
  if (kind == Memory::kDevice) return data;
  FR_ASSIGN_OR_RETURN(p.staging, Take(device_pool_, bytes, false));
  p.bytes = bytes;
  const void* from = data;
  if (kind == Memory::kPageable) {
    // A copy from pageable memory may wait for the stream's earlier work (NCCL's, with no
    // deadline), and one into it holds the thread until the stream gets there: both go
    // through pinned memory, filled now and copied out when the request completes.
    FR_ASSIGN_OR_RETURN(p.bounce, Take(pinned_pool_, bytes, true));
    if (fill) std::memcpy(p.bounce, data, bytes);
    from = p.bounce;
  }
  // Pinned memory is read when the stream gets there.
  if (fill) CUDA_CHECK(cudaMemcpyAsync(p.staging, from, bytes, cudaMemcpyHostToDevice, stream));
  return p.staging;
}

absl::Status NcclTransport::Land(Pending& p, void* data, int64_t bytes, cudaStream_t stream) {
  if (p.staging == nullptr) return absl::OkStatus();  // the operation wrote into `data`
  void* out = data;
  if (p.bounce != nullptr) {
    p.land = data;
    out = p.bounce;
  }
  CUDA_CHECK(cudaMemcpyAsync(out, p.staging, bytes, cudaMemcpyDeviceToHost, stream));
  return absl::OkStatus();
}

absl::Status NcclTransport::TagBuffers(Pending& p, int tag, cudaStream_t stream) {
  FR_ASSIGN_OR_RETURN(p.tag_host, Take(pinned_pool_, sizeof(int), true));
  FR_ASSIGN_OR_RETURN(p.tag_device, Take(device_pool_, sizeof(int), false));
  if (tag < 0) return absl::OkStatus();  // a receive's: filled by the message
  std::memcpy(p.tag_host, &tag, sizeof(int));
  CUDA_CHECK(
      cudaMemcpyAsync(p.tag_device, p.tag_host, sizeof(int), cudaMemcpyHostToDevice, stream));
  return absl::OkStatus();
}

absl::Status NcclTransport::Record(Pending& p, cudaStream_t stream) {
  if (events_.empty()) {
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    events_.push_back(e);
  }
  p.done = events_.back();
  events_.pop_back();
  CUDA_CHECK(cudaEventRecord(p.done, stream));
  return absl::OkStatus();
}

void NcclTransport::Finish(Pending& p) {
  if (p.land != nullptr) std::memcpy(p.land, p.bounce, p.bytes);
  if (p.staging != nullptr) device_pool_.emplace(p.bytes, p.staging);
  if (p.bounce != nullptr) pinned_pool_.emplace(p.bytes, p.bounce);
  if (p.tag_host != nullptr) {
    int got = 0;
    std::memcpy(&got, p.tag_host, sizeof(int));
    if (p.expected_tag >= 0 && got != p.expected_tag) {
      p.error = absl::InternalError(absl::StrFormat(
          "%s came with tag %d: the two ends of the link send and consume its messages in "
          "different orders, and NCCL matches them in order",
          p.what, got));
    }
    pinned_pool_.emplace(sizeof(int), p.tag_host);
    device_pool_.emplace(sizeof(int), p.tag_device);
  }
  if (p.done != nullptr) events_.push_back(p.done);
  Pending done;
  done.what = std::move(p.what);
  done.error = std::move(p.error);
  done.complete = true;
  p = std::move(done);
}
}  // namespace freeride::pipeline::nccl_internal
