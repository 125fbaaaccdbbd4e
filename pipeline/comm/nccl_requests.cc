// The NCCL transport's operations: messages (grouped with the tag ahead of them, on their
// link's communicator and stream; to this rank itself, copies), sums, and their completion.
#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/cuda_check.h"
#include "core/status.h"
#include "core/timer.h"
#include "pipeline/comm/nccl_transport_impl.h"

namespace freeride::pipeline::nccl_internal {

absl::Status NcclTransport::SelfCopy(Pending& send, Pending& recv, const void* src, void* dst,
                                     int64_t bytes) {
  // cudaMemcpyDefault: either end may be device, pinned or pageable memory.
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, self_stream_));
  FR_RETURN_IF_ERROR(Record(send, self_stream_));
  return Record(recv, self_stream_);
}

absl::StatusOr<Transport::Request> NcclTransport::IsendAfter(const void* data, int64_t bytes,
                                                             int peer, int tag, void* written) {
  std::lock_guard<std::mutex> lock(mu_);
  FR_RETURN_IF_ERROR(Usable());
  CUDA_CHECK(cudaSetDevice(device_));
  Pending p;
  p.what = absl::StrFormat("the send of %d bytes to rank %d (tag %d)", bytes, peer, tag);
  // The stream that reads the buffer waits for the writer's event first: whatever it runs
  // after this, the copy to this rank itself when its receive comes too, sees the message.
  auto after_written = [&](cudaStream_t stream) -> absl::Status {
    if (written != nullptr) {
      CUDA_CHECK(cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(written), 0));
    }
    return absl::OkStatus();
  };
  if (peer == rank()) {
    FR_RETURN_IF_ERROR(after_written(self_stream_));
    const Request r = Add(std::move(p));
    auto waiting = self_recvs_.find(tag);
    if (waiting == self_recvs_.end()) {
      self_sends_[tag] = {r, const_cast<void*>(data), bytes};
    } else {
      FR_RETURN_IF_ERROR(SelfCopy(requests_[r], requests_[waiting->second.request], data,
                                  waiting->second.data, bytes));
      self_recvs_.erase(waiting);
    }
    return r;
  }
  auto link = link_of_.find({rank(), peer, tag / tags_per_channel_});
  if (link == link_of_.end()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "no NCCL link from rank %d to rank %d for tag %d (NcclTransportOptions::links)", rank(),
        peer, tag));
  }
  const Comm& c = comms_[link->second];
  p.comm = link->second;
  FR_RETURN_IF_ERROR(after_written(c.stream));
  FR_ASSIGN_OR_RETURN(void* buffer, Buffer(p, const_cast<void*>(data), bytes, true, c.stream));
  FR_RETURN_IF_ERROR(TagBuffers(p, tag, c.stream));
  NCCL_CHECK(ncclGroupStart());
  NCCL_CHECK(ncclSend(p.tag_device, sizeof(int), ncclChar, 1, c.comm, c.stream));
  NCCL_CHECK(ncclSend(buffer, static_cast<size_t>(bytes), ncclChar, 1, c.comm, c.stream));
  FR_RETURN_IF_ERROR(Issued(c, ncclGroupEnd(), p.what));
  FR_RETURN_IF_ERROR(Record(p, c.stream));
  return Add(std::move(p));
}

absl::StatusOr<Transport::Request> NcclTransport::Irecv(void* data, int64_t bytes, int peer,
                                                        int tag) {
  std::lock_guard<std::mutex> lock(mu_);
  FR_RETURN_IF_ERROR(Usable());
  CUDA_CHECK(cudaSetDevice(device_));
  Pending p;
  p.what = absl::StrFormat("the message of %d bytes from rank %d (tag %d)", bytes, peer, tag);
  if (peer == rank()) {
    const Request r = Add(std::move(p));
    auto sent = self_sends_.find(tag);
    if (sent == self_sends_.end()) {
      self_recvs_[tag] = {r, data, bytes};
    } else {
      FR_RETURN_IF_ERROR(
          SelfCopy(requests_[sent->second.request], requests_[r], sent->second.data, data, bytes));
      self_sends_.erase(sent);
    }
    return r;
  }
  auto link = link_of_.find({peer, rank(), tag / tags_per_channel_});
  if (link == link_of_.end()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "no NCCL link from rank %d to rank %d for tag %d (NcclTransportOptions::links)", peer,
        rank(), tag));
  }
  const Comm& c = comms_[link->second];
  p.comm = link->second;
  FR_ASSIGN_OR_RETURN(void* buffer, Buffer(p, data, bytes, false, c.stream));
  FR_RETURN_IF_ERROR(TagBuffers(p, -1, c.stream));
  p.expected_tag = tag;
  NCCL_CHECK(ncclGroupStart());
  NCCL_CHECK(ncclRecv(p.tag_device, sizeof(int), ncclChar, 0, c.comm, c.stream));
  NCCL_CHECK(ncclRecv(buffer, static_cast<size_t>(bytes), ncclChar, 0, c.comm, c.stream));
  FR_RETURN_IF_ERROR(Issued(c, ncclGroupEnd(), p.what));
  CUDA_CHECK(
      cudaMemcpyAsync(p.tag_host, p.tag_device, sizeof(int), cudaMemcpyDeviceToHost, c.stream));
  FR_RETURN_IF_ERROR(Land(p, data, bytes, c.stream));
  FR_RETURN_IF_ERROR(Record(p, c.stream));
  return Add(std::move(p));
}

template <typename T>
absl::StatusOr<Transport::Request> NcclTransport::StartSum(T* data, int64_t n,
                                                           const std::vector<int>& group) {
  std::lock_guard<std::mutex> lock(mu_);
  FR_RETURN_IF_ERROR(Usable());
  Pending p;
  p.what = absl::StrFormat("the sum of %d values over ranks {%s}", n, absl::StrJoin(group, ","));
  if (group.size() <= 1) {
    p.complete = true;  // a sum over this rank alone
    return Add(std::move(p));
  }
  auto found = group_of_.find(group);
  if (found == group_of_.end()) {
    // A group nobody declared (NcclTransportOptions::groups): the bootstrap sums it.
    ++bootstrap_sums_;
    FR_ASSIGN_OR_RETURN(p.bootstrap, bootstrap_.StartAllReduceSum(data, n, group));
    return Add(std::move(p));
  }
  CUDA_CHECK(cudaSetDevice(device_));
  const Comm& c = comms_[found->second];
  p.comm = found->second;
  const int64_t bytes = n * static_cast<int64_t>(sizeof(T));
  FR_ASSIGN_OR_RETURN(void* buffer, Buffer(p, data, bytes, true, c.stream));
  FR_RETURN_IF_ERROR(Issued(c,
                            ncclAllReduce(buffer, buffer, static_cast<size_t>(n), NcclType<T>(),
                                          ncclSum, c.comm, c.stream),
                            p.what));
  FR_RETURN_IF_ERROR(Land(p, data, bytes, c.stream));
  FR_RETURN_IF_ERROR(Record(p, c.stream));
  return Add(std::move(p));
}

absl::StatusOr<Transport::Request> NcclTransport::StartDevice(
    bool rooted, DeviceRooted kind, const std::vector<DeviceRange>& ranges,
    const std::vector<int>& roots, const std::vector<int>& group, void* ready) {
  std::lock_guard<std::mutex> lock(mu_);
  FR_RETURN_IF_ERROR(Usable());
  int64_t n = 0;
  for (const DeviceRange& r : ranges) n += r.n;
  Pending p;
  p.what = absl::StrFormat("the %s of %d device values in %d ranges over ranks {%s}",
                           !rooted                         ? "sum"
                           : kind == DeviceRooted::kReduce ? "reduce to their owners"
                                                           : "broadcast from their owners",
                           n, ranges.size(), absl::StrJoin(group, ","));
  if (rooted) {
    bool roots_ok = roots.size() == ranges.size();
    for (int root : roots)
      roots_ok = roots_ok && root >= 0 && root < static_cast<int>(group.size());
    if (!roots_ok) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: %d roots for %d ranges, each a member of the group's %d", p.what,
                          roots.size(), ranges.size(), group.size()));
    }
  }
  if (group.size() <= 1) {
    p.complete = true;  // a sum over this rank alone
    return Add(std::move(p));
  }
  auto found = group_of_.find(group);
  if (found == group_of_.end()) {
    // The bootstrap (MPI) sums host memory only.
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the group has no NCCL communicator (NcclTransportOptions::groups)", p.what));
  }
  for (const DeviceRange& r : ranges) {
    if (r.n > 0 && KindOf(r.data) != Memory::kDevice) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: a range is not device memory", p.what));
    }
    if (r.bf16 && (!rooted || kind != DeviceRooted::kBroadcast)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: a bf16 range, which only a broadcast carries", p.what));
    }
  }
  CUDA_CHECK(cudaSetDevice(device_));
  const Comm& c = comms_[found->second];
  p.comm = found->second;
  // The values are final once the writer's stream reaches `ready`: the sum's stream waits for
  // it there, not the host.
  if (ready != nullptr) {
    CUDA_CHECK(cudaStreamWaitEvent(c.stream, static_cast<cudaEvent_t>(ready), 0));
  }
  // One NCCL group: every range in place, one launch, the ranges' values as in one buffer
  // (a sum is elementwise); ZeRO-1's unequal shares as one reduce or broadcast per range, its
  // owner the root (ncclReduceScatter and ncclAllGather take equal parts only).
  NCCL_CHECK(ncclGroupStart());
  for (size_t i = 0; i < ranges.size(); ++i) {
    const DeviceRange& r = ranges[i];
    const size_t count = static_cast<size_t>(r.n);
    if (!rooted) {
      NCCL_CHECK(ncclAllReduce(r.data, r.data, count, ncclFloat, ncclSum, c.comm, c.stream));
    } else if (kind == DeviceRooted::kReduce) {
      NCCL_CHECK(ncclReduce(r.data, r.data, count, ncclFloat, ncclSum, roots[i], c.comm, c.stream));
    } else {
      NCCL_CHECK(ncclBroadcast(r.data, r.data, count, r.bf16 ? ncclBfloat16 : ncclFloat, roots[i],
                               c.comm, c.stream));
    }
  }
  FR_RETURN_IF_ERROR(Issued(c, ncclGroupEnd(), p.what));
  FR_RETURN_IF_ERROR(Record(p, c.stream));
  return Add(std::move(p));
}

bool NcclTransport::Test(Request request) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = requests_.find(request);
  if (it == requests_.end()) return true;
  Pending& p = it->second;
  if (p.complete) return true;
  if (p.bootstrap >= 0) return bootstrap_.Test(p.bootstrap);
  if (p.done == nullptr || aborted_) return false;  // a self copy whose other half is to come
  if (cudaEventQuery(p.done) != cudaSuccess) return false;
  Finish(p);
  return true;
}

absl::Status NcclTransport::Wait(Request request, double timeout_s) {
  Request bootstrap = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = requests_.find(request);
    if (it == requests_.end()) return absl::InvalidArgumentError("unknown request");
    bootstrap = it->second.bootstrap;
  }
  if (bootstrap >= 0) {
    absl::Status s = bootstrap_.Wait(bootstrap, timeout_s);
    std::lock_guard<std::mutex> lock(mu_);
    requests_.erase(request);
    return s;
  }
  const double deadline = MonotonicSeconds() + timeout_s;
  auto pause = std::chrono::microseconds(10);
  while (true) {
    const bool done = Test(request);
    std::lock_guard<std::mutex> lock(mu_);
    FR_RETURN_IF_ERROR(Usable());
    Pending& p = requests_[request];
    // An operation that failed (a peer gone) completes too: its error is asynchronous, and
    // NCCL's operations after it may hang, so every communicator is aborted.
    for (const Comm& c : comms_) {
      ncclResult_t async = ncclSuccess;
      NCCL_CHECK(ncclCommGetAsyncError(c.comm, &async));
      if (async != ncclSuccess && async != ncclInProgress) {
        return Abort(absl::UnavailableError(
            absl::StrFormat("NCCL error on ranks {%s} while waiting for %s: %s",
                            absl::StrJoin(c.members, ","), p.what, ncclGetErrorString(async))));
      }
    }
    if (done) {
      absl::Status s = std::move(p.error);
      requests_.erase(request);
      return s;
    }
    if (MonotonicSeconds() > deadline) {
      return Abort(absl::DeadlineExceededError(
          absl::StrFormat("%s did not complete within %.1f s", p.what, timeout_s)));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(500));
  }
}

template absl::StatusOr<Transport::Request> NcclTransport::StartSum(float*, int64_t,
                                                                    const std::vector<int>&);
template absl::StatusOr<Transport::Request> NcclTransport::StartSum(double*, int64_t,
                                                                    const std::vector<int>&);

}  // namespace freeride::pipeline::nccl_internal
