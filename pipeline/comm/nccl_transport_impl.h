// The NCCL transport's class, shared by its three files: nccl_transport.cc (the communicators'
// set-up, teardown and errors), nccl_buffers.cc (device, pinned and bounce buffers, events,
// tags) and nccl_requests.cc (messages, sums, Test and Wait). Only nccl_transport.h is public.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "core/timer.h"
#include "pipeline/comm/nccl_transport.h"

namespace freeride::pipeline::nccl_internal {

enum class Memory { kDevice, kPinned, kPageable };

Memory KindOf(const void* p);

template <typename T>
constexpr ncclDataType_t NcclType() {
  return std::is_same_v<T, float> ? ncclFloat : ncclDouble;
}

class NcclTransport final : public Transport {
 public:
  NcclTransport(Transport& bootstrap, int device) : bootstrap_(bootstrap), device_(device) {}
  ~NcclTransport() override;

  absl::Status Init(const NcclTransportOptions& options);

  int rank() const override { return bootstrap_.rank(); }
  int size() const override { return bootstrap_.size(); }
  absl::StatusOr<Request> Isend(const void* data, int64_t bytes, int peer, int tag) override {
    return IsendAfter(data, bytes, peer, tag, nullptr);
  }
  absl::StatusOr<Request> IsendAfter(const void* data, int64_t bytes, int peer, int tag,
                                     void* written) override;
  absl::StatusOr<Request> Irecv(void* data, int64_t bytes, int peer, int tag) override;
  bool CarriesDeviceMemory() const override { return true; }
  absl::Status Wait(Request request, double timeout_s) override;
  bool Test(Request request) override;
  absl::Status AllReduceSum(float* data, int64_t n, const std::vector<int>& group,
                            double timeout_s) override {
    return Sum(data, n, group, timeout_s);
  }
  absl::Status AllReduceSum(double* data, int64_t n, const std::vector<int>& group,
                            double timeout_s) override {
    return Sum(data, n, group, timeout_s);
  }
  absl::StatusOr<Request> StartAllReduceSum(float* data, int64_t n,
                                            const std::vector<int>& group) override {
    return StartSum(data, n, group);
  }
  absl::StatusOr<Request> StartAllReduceSum(double* data, int64_t n,
                                            const std::vector<int>& group) override {
    return StartSum(data, n, group);
  }
  absl::StatusOr<Request> StartDeviceSum(const std::vector<DeviceRange>& ranges,
                                         const std::vector<int>& group, void* ready) override {
    return StartDevice(/*rooted=*/false, DeviceRooted::kReduce, ranges, {}, group, ready);
  }
  absl::StatusOr<Request> StartDeviceRooted(DeviceRooted kind,
                                            const std::vector<DeviceRange>& ranges,
                                            const std::vector<int>& roots,
                                            const std::vector<int>& group, void* ready) override {
    return StartDevice(/*rooted=*/true, kind, ranges, roots, group, ready);
  }
  int64_t bootstrap_sums() const { return bootstrap_sums_; }
  void AbortInFlight() override;
  void AbortLocally();  // AbortInFlight without waiting for the other ranks

 private:
  // StartDeviceSum's all-reduces (`rooted` false) or StartDeviceRooted's reduces or
  // broadcasts, one NCCL group on the group's communicator.
  absl::StatusOr<Request> StartDevice(bool rooted, DeviceRooted kind,
                                      const std::vector<DeviceRange>& ranges,
                                      const std::vector<int>& roots, const std::vector<int>& group,
                                      void* ready);
  struct Comm {
    std::vector<int> members;  // global ranks; a link's are {sender, receiver}
    std::string name;          // for errors: "the link from rank 0 to rank 1 (channel 2)"
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
  };
  struct Pending {
    std::string what;            // for errors: "a message from rank 1 (tag 4)"
    int comm = -1;               // into comms_; -1: a copy to this rank itself, or the bootstrap's
    cudaEvent_t done = nullptr;  // null until the operation is enqueued (self copies)
    void* staging = nullptr;     // device memory of `bytes`, back to the pool once complete
    void* bounce = nullptr;      // pinned memory copied into `land` once complete
    void* land = nullptr;
    int64_t bytes = 0;
    Request bootstrap = -1;  // a sum handed to the bootstrap transport
    // A message's tag travels ahead of it (NCCL has none): pinned and device copies of it,
    // and the tag the receive expects.
    void* tag_host = nullptr;
    void* tag_device = nullptr;
    int expected_tag = -1;
    bool complete = false;
    absl::Status error;  // what Wait returns once the request is complete
  };
  // A message to this rank itself, waiting for its other half.
  struct SelfHalf {
    Request request = -1;
    void* data = nullptr;
    int64_t bytes = 0;
  };

  template <typename T>
  absl::Status Sum(T* data, int64_t n, const std::vector<int>& group, double timeout_s) {
    FR_ASSIGN_OR_RETURN(Request r, StartSum(data, n, group));
    return Wait(r, timeout_s);
  }
  // Defined for float and double in nccl_requests.cc.
  template <typename T>
  absl::StatusOr<Request> StartSum(T* data, int64_t n, const std::vector<int>& group);
  absl::Status Usable() const;
  Request Add(Pending p) {
    requests_[next_] = std::move(p);
    return next_++;
  }
  // Device memory for an operation on `stream` over `data` (of `bytes`): `data` itself when it
  // is device memory, else a staging buffer (filled from `data` first when `fill`).
  absl::StatusOr<void*> Buffer(Pending& p, void* data, int64_t bytes, bool fill,
                               cudaStream_t stream);
  // After the operation: its result from the staging buffer into `data` (pinned: in stream
  // order; pageable: through a bounce buffer, when the request completes).
  absl::Status Land(Pending& p, void* data, int64_t bytes, cudaStream_t stream);
  // A message's tag: pinned and device memory for it, filled with `tag` unless it is < 0.
  absl::Status TagBuffers(Pending& p, int tag, cudaStream_t stream);
  absl::Status Record(Pending& p, cudaStream_t stream);
  // A call on a nonblocking communicator (SettleNccl): `what` fails at `deadline`, `budget_s`
  // after it started, or on an NCCL error, every communicator aborted.
  absl::Status Settle(const Comm& c, ncclResult_t called, double deadline, double budget_s,
                      const std::string& what);
  absl::Status Issued(const Comm& c, ncclResult_t called, const std::string& what) {
    return Settle(c, called, MonotonicSeconds() + timeout_s_, timeout_s_, what);
  }
  absl::StatusOr<void*> Take(std::multimap<int64_t, void*>& pool, int64_t bytes, bool pinned);
  void Finish(Pending& p);  // the landing copy; buffers and event back to their pools
  absl::Status Abort(const absl::Status& cause);
  void AbortComms() {
    for (Comm& c : comms_) {
      if (c.comm != nullptr) ncclCommAbort(c.comm);
    }
    aborted_ = true;
  }
  absl::Status SelfCopy(Pending& send, Pending& recv, const void* src, void* dst, int64_t bytes);

  Transport& bootstrap_;
  const int device_;
  std::mutex mu_;  // Test may come from a side thread's input_ready
  std::vector<Comm> comms_;
  std::map<NcclLink, int> link_of_;  // → comms_
  int tags_per_channel_ = 1;
  std::map<std::vector<int>, int> group_of_;  // members → comms_
  std::map<Request, Pending> requests_;
  Request next_ = 0;
  std::map<int, SelfHalf> self_sends_, self_recvs_;  // by tag
  cudaStream_t self_stream_ = nullptr;
  std::multimap<int64_t, void*> device_pool_, pinned_pool_;
  std::vector<cudaEvent_t> events_;
  int64_t bootstrap_sums_ = 0;
  double timeout_s_ = 300;
  bool aborted_ = false;
  bool closed_ = false;  // AbortInFlight has run
};

}  // namespace freeride::pipeline::nccl_internal
