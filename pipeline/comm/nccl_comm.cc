#include "pipeline/comm/nccl_comm.h"

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/cuda_check.h"
#include "core/timer.h"
#include "pipeline/comm/nccl_settle.h"

namespace freeride::pipeline {

absl::StatusOr<std::unique_ptr<NcclComm>> NcclComm::Create(Transport& bootstrap, int device,
                                                           double timeout_s) {
  std::unique_ptr<NcclComm> c(new NcclComm());
  c->rank_ = bootstrap.rank();
  c->size_ = bootstrap.size();
  c->device_ = device;
  CUDA_CHECK(cudaSetDevice(device));
  // The id's bytes travel as doubles in a sum to which only rank 0 contributes: exact, and it
  // needs nothing from the bootstrap transport beyond what every transport has.
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (c->rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  std::vector<double> bytes(sizeof(id));
  const auto* raw = reinterpret_cast<const unsigned char*>(&id);
  for (size_t i = 0; i < sizeof(id); ++i) bytes[i] = c->rank_ == 0 ? raw[i] : 0.0;
  absl::Status s = bootstrap.AllReduceSum(bytes.data(), static_cast<int64_t>(bytes.size()),
                                          bootstrap.AllRanks(), timeout_s);
  if (!s.ok()) return s;
  auto* out = reinterpret_cast<unsigned char*>(&id);
  for (size_t i = 0; i < sizeof(id); ++i) out[i] = static_cast<unsigned char>(bytes[i]);
  // Nonblocking, so that a rank that never joins fails the deadline instead of hanging this.
  c->timeout_s_ = timeout_s;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  FR_RETURN_IF_ERROR(c->Settle(ncclCommInitRankConfig(&c->comm_, c->size_, id, c->rank_, &config),
                               "the initialisation of the NCCL communicator"));
  CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&c->done_, cudaEventDisableTiming));
  return c;
}

NcclComm::~NcclComm() {
  cudaSetDevice(device_);
  if (comm_ != nullptr) {
    if (!aborted_) {
      cudaStreamSynchronize(stream_);
      ncclCommDestroy(comm_);
    }
  }
  if (done_ != nullptr) cudaEventDestroy(done_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status NcclComm::Exchange(const void* send, int64_t send_bytes, int send_peer, void* recv,
                                int64_t recv_bytes, int recv_peer, cudaEvent_t after) {
  if (aborted_) return absl::FailedPreconditionError("the NCCL communicator was aborted");
  CUDA_CHECK(cudaSetDevice(device_));  // the calling thread's current device may be another
  if (after != nullptr) CUDA_CHECK(cudaStreamWaitEvent(stream_, after, 0));
  NCCL_CHECK(ncclGroupStart());
  if (send_peer >= 0) {
    NCCL_CHECK(ncclSend(send, static_cast<size_t>(send_bytes), ncclChar, send_peer, comm_,
                        stream_));
  }
  if (recv_peer >= 0) {
    NCCL_CHECK(ncclRecv(recv, static_cast<size_t>(recv_bytes), ncclChar, recv_peer, comm_,
                        stream_));
  }
  return Settle(ncclGroupEnd(), "an exchange");
}

absl::Status NcclComm::AllReduceSum(float* data, int64_t n, cudaEvent_t after) {
  if (aborted_) return absl::FailedPreconditionError("the NCCL communicator was aborted");
  CUDA_CHECK(cudaSetDevice(device_));  // the calling thread's current device may be another
  if (after != nullptr) CUDA_CHECK(cudaStreamWaitEvent(stream_, after, 0));
  return Settle(
      ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat, ncclSum, comm_, stream_),
      "a sum");
}

absl::Status NcclComm::Settle(ncclResult_t called, const char* what) {
  const ncclResult_t state = SettleNccl(comm_, called, MonotonicSeconds() + timeout_s_);
  if (state == ncclSuccess) return absl::OkStatus();
  if (comm_ != nullptr) ncclCommAbort(comm_);  // only an abort ends what is in flight
  aborted_ = true;
  if (state != ncclInProgress) return NcclStatus(state, what, __FILE__, __LINE__);
  return absl::DeadlineExceededError(
      absl::StrFormat("%s on rank %d did not complete within %.1f s: a rank of the %d never came "
                      "(communicator aborted)",
                      what, rank_, timeout_s_, size_));
}

absl::StatusOr<cudaEvent_t> NcclComm::Done() {
  CUDA_CHECK(cudaSetDevice(device_));
  CUDA_CHECK(cudaEventRecord(done_, stream_));
  return done_;
}

absl::Status NcclComm::Wait(double timeout_s) {
  if (aborted_) return absl::FailedPreconditionError("the NCCL communicator was aborted");
  CUDA_CHECK(cudaSetDevice(device_));
  CUDA_CHECK(cudaEventRecord(done_, stream_));
  const double deadline = MonotonicSeconds() + timeout_s;
  auto pause = std::chrono::microseconds(10);
  while (true) {
    // An operation that failed (a peer gone) completes too: its error is asynchronous.
    const cudaError_t q = cudaEventQuery(done_);
    if (q != cudaSuccess && q != cudaErrorNotReady) CUDA_CHECK(q);
    ncclResult_t async = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
    if (async == ncclSuccess && q == cudaSuccess) return absl::OkStatus();
    if (async != ncclSuccess && async != ncclInProgress) {
      // NCCL's operations may hang after an asynchronous error: only an abort ends them.
      ncclCommAbort(comm_);
      aborted_ = true;
      return NcclStatus(async, "ncclCommGetAsyncError", __FILE__, __LINE__);
    }
    if (MonotonicSeconds() > deadline) {
      ncclCommAbort(comm_);
      aborted_ = true;
      return absl::DeadlineExceededError(absl::StrFormat(
          "NCCL operations on rank %d did not complete within %.1f s (communicator aborted)", rank_,
          timeout_s));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(500));
  }
}

}  // namespace freeride::pipeline
