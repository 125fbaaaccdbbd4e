#include "pipeline/comm/nccl_transport.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/cuda_check.h"
#include "core/status.h"
#include "core/timer.h"
#include "pipeline/comm/nccl_settle.h"

namespace freeride::pipeline {
namespace {

enum class Memory { kDevice, kPinned, kPageable };

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
  absl::StatusOr<Request> Isend(const void* data, int64_t bytes, int peer, int tag) override;
  absl::StatusOr<Request> Irecv(void* data, int64_t bytes, int peer, int tag) override;
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
  int64_t bootstrap_sums() const { return bootstrap_sums_; }
  void AbortInFlight() override;
  void AbortLocally();  // AbortInFlight without waiting for the other ranks

 private:
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
  std::map<NcclLink, int> link_of_;             // → comms_
  int tags_per_channel_ = 1;
  std::map<std::vector<int>, int> group_of_;    // members → comms_
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

absl::Status NcclTransport::Init(const NcclTransportOptions& options) {
  CUDA_CHECK(cudaSetDevice(device_));
  const int me = rank();
  std::vector<std::vector<int>> specs;
  std::vector<NcclLink> links;
  for (const NcclLink& link : options.links) {
    if (link.sender == link.receiver) continue;  // a copy (SelfCopy)
    if (std::find(links.begin(), links.end(), link) != links.end()) continue;
    links.push_back(link);
    specs.push_back({link.sender, link.receiver});
  }
  tags_per_channel_ = std::max(1, options.tags_per_channel);
  timeout_s_ = options.timeout_s;
  for (const std::vector<int>& group : options.groups) {
    if (group.size() > 1 &&
        std::find(specs.begin() + links.size(), specs.end(), group) == specs.end()) {
      specs.push_back(group);
    }
  }
  // Every communicator's id, made by its first member, in one sum (see NcclComm::Create).
  constexpr int kIdBytes = sizeof(ncclUniqueId);
  std::vector<double> ids(specs.size() * kIdBytes, 0.0);
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i][0] != me) continue;
    ncclUniqueId id;
    NCCL_CHECK(ncclGetUniqueId(&id));
    for (int b = 0; b < kIdBytes; ++b) {
      ids[i * kIdBytes + b] = static_cast<unsigned char>(id.internal[b]);
    }
  }
  FR_RETURN_IF_ERROR(bootstrap_.AllReduceSum(ids.data(), static_cast<int64_t>(ids.size()),
                                             bootstrap_.AllRanks(), options.timeout_s));
  // In the same order everywhere: each rank waits in the first it shares with a rank not yet
  // there, which is never waiting for it; one that never comes fails the deadline.
  const double deadline = MonotonicSeconds() + options.timeout_s;
  for (size_t i = 0; i < specs.size(); ++i) {
    auto at = std::find(specs[i].begin(), specs[i].end(), me);
    if (at == specs[i].end()) continue;
    ncclUniqueId id;
    for (int b = 0; b < kIdBytes; ++b) {
      id.internal[b] = static_cast<char>(static_cast<unsigned char>(ids[i * kIdBytes + b]));
    }
    Comm& c = comms_.emplace_back();  // aborted with the others if it fails
    c.members = specs[i];
    c.name = i < links.size()
                 ? absl::StrFormat("the link from rank %d to rank %d (channel %d)", links[i].sender,
                                   links[i].receiver, links[i].channel)
                 : absl::StrFormat("the group of ranks {%s}", absl::StrJoin(specs[i], ","));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t init =
        ncclCommInitRankConfig(&c.comm, static_cast<int>(specs[i].size()), id,
                               static_cast<int>(at - specs[i].begin()), &config);
    FR_RETURN_IF_ERROR(Settle(c, init, deadline, options.timeout_s,
                              "the initialisation of the NCCL communicators"));
    CUDA_CHECK(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
    if (i < links.size()) {
      link_of_[links[i]] = static_cast<int>(comms_.size() - 1);
    } else {
      group_of_[specs[i]] = static_cast<int>(comms_.size() - 1);
    }
  }
  CUDA_CHECK(cudaStreamCreateWithFlags(&self_stream_, cudaStreamNonBlocking));
  return absl::OkStatus();
}

// Every rank comes here as its trainer goes. First all of them: a send still in flight here
// (one of a step run ahead) waits for its receiver, which may still drain it. Then what is left
// in flight (receives posted ahead, a failed step's, whose sends will never come) would hold the
// streams forever: it is aborted instead.
void NcclTransport::AbortInFlight() {
  if (!closed_) {
    closed_ = true;
    double token[1] = {0};
    // A rank that never comes (it failed) only delays this by the timeout.
    bootstrap_.AllReduceSum(token, 1, bootstrap_.AllRanks(), timeout_s_).IgnoreError();
  }
  AbortLocally();
}

void NcclTransport::AbortLocally() {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return;
  cudaSetDevice(device_);
  bool in_flight = !self_sends_.empty() || !self_recvs_.empty();
  for (auto& [id, p] : requests_) {
    in_flight = in_flight || (p.done != nullptr && cudaEventQuery(p.done) != cudaSuccess);
  }
  if (in_flight) AbortComms();
}

NcclTransport::~NcclTransport() {
  AbortLocally();
  cudaSetDevice(device_);
  for (Comm& c : comms_) {
    if (c.stream != nullptr) cudaStreamSynchronize(c.stream);
    if (!aborted_ && c.comm != nullptr) ncclCommDestroy(c.comm);
    if (c.stream != nullptr) cudaStreamDestroy(c.stream);
  }
  if (self_stream_ != nullptr) {
    cudaStreamSynchronize(self_stream_);
    cudaStreamDestroy(self_stream_);
  }
  for (auto& [id, p] : requests_) {
    if (p.done != nullptr) events_.push_back(p.done);
    if (p.staging != nullptr) cudaFree(p.staging);
    if (p.bounce != nullptr) cudaFreeHost(p.bounce);
    if (p.tag_device != nullptr) cudaFree(p.tag_device);
    if (p.tag_host != nullptr) cudaFreeHost(p.tag_host);
  }
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  for (auto& [bytes, p] : device_pool_) cudaFree(p);
  for (auto& [bytes, p] : pinned_pool_) cudaFreeHost(p);
}

absl::Status NcclTransport::Usable() const {
  if (aborted_) {
    return absl::FailedPreconditionError(
        "the NCCL communicators were aborted after an earlier error");
  }
  return absl::OkStatus();
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

absl::Status NcclTransport::Settle(const Comm& c, ncclResult_t called, double deadline,
                                   double budget_s, const std::string& what) {
  const ncclResult_t state = SettleNccl(c.comm, called, deadline);
  if (state == ncclSuccess) return absl::OkStatus();
  if (state != ncclInProgress) {
    return Abort(absl::UnavailableError(
        absl::StrFormat("NCCL error on %s in %s: %s", c.name, what, ncclGetErrorString(state))));
  }
  std::vector<int> others;
  for (int r : c.members) {
    if (r != rank()) others.push_back(r);
  }
  return Abort(absl::DeadlineExceededError(
      absl::StrFormat("%s did not complete within %.1f s: %s %s of %s did not come", what, budget_s,
                      others.size() == 1 ? "rank" : "ranks", absl::StrJoin(others, ", "), c.name)));
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

absl::Status NcclTransport::SelfCopy(Pending& send, Pending& recv, const void* src, void* dst,
                                     int64_t bytes) {
  // cudaMemcpyDefault: either end may be device, pinned or pageable memory.
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, self_stream_));
  FR_RETURN_IF_ERROR(Record(send, self_stream_));
  return Record(recv, self_stream_);
}

absl::StatusOr<Transport::Request> NcclTransport::Isend(const void* data, int64_t bytes, int peer,
                                                        int tag) {
  std::lock_guard<std::mutex> lock(mu_);
  FR_RETURN_IF_ERROR(Usable());
  CUDA_CHECK(cudaSetDevice(device_));
  Pending p;
  p.what = absl::StrFormat("the send of %d bytes to rank %d (tag %d)", bytes, peer, tag);
  if (peer == rank()) {
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

absl::Status NcclTransport::Abort(const absl::Status& cause) {
  // NCCL's operations may hang after an error, and a peer may never come: only an abort ends
  // what is in flight, on every communicator.
  AbortComms();
  return absl::Status(cause.code(), absl::StrCat(cause.message(), " (NCCL communicators aborted)"));
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

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> MakeNcclTransport(Transport& bootstrap,
                                                             const NcclTransportOptions& options) {
  auto transport = std::make_unique<NcclTransport>(bootstrap, options.device);
  FR_RETURN_IF_ERROR(transport->Init(options));
  return transport;
}

int64_t NcclTransportBootstrapSums(const Transport& transport) {
  const auto* nccl = dynamic_cast<const NcclTransport*>(&transport);
  return nccl == nullptr ? 0 : nccl->bootstrap_sums();
}

}  // namespace freeride::pipeline
