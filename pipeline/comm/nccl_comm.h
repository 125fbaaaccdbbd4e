// NCCL between GPUs: a communicator over the ranks of a bootstrap Transport (MPI, or the
// one-rank world), working on device buffers on its own stream, ordered against the compute
// stream by events. Two operations, the ones the pipeline needs between GPUs: a grouped
// exchange with neighbours (send to one rank while receiving from another, the pipeline's
// activation/gradient hand-off, self included) and an in-place sum over all ranks (gradients).
// Every wait polls with a deadline and aborts the communicator when it passes, so a lost peer
// is an error, never a hang.
//
// Only built with the CUDA backend. The StageExecutor still moves messages through host
// memory and the MPI transport (one GPU per node in CI-less tests, several ranks per GPU);
// device-buffer messaging in the executor is the next step (docs/ARCHITECTURE.md §0).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>

#include "absl/status/statusor.h"
#include "pipeline/comm/transport.h"

namespace freeride::pipeline {

class NcclComm {
 public:
  // Collective over every rank of `bootstrap`: rank 0 makes the NCCL id, the others get it
  // through a sum over the bootstrap transport, within `timeout_s`. `device`: this rank's CUDA
  // device.
  static absl::StatusOr<std::unique_ptr<NcclComm>> Create(Transport& bootstrap, int device,
                                                          double timeout_s);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  cudaStream_t stream() const { return stream_; }

  // Sends `send_bytes` from `send` to `send_peer` and receives `recv_bytes` into `recv` from
  // `recv_peer`, as one NCCL group (either peer may be -1 for none, or this rank itself).
  // `after` (may be null): an event on the compute stream the exchange must wait for.
  absl::Status Exchange(const void* send, int64_t send_bytes, int send_peer, void* recv,
                        int64_t recv_bytes, int recv_peer, cudaEvent_t after);
  // In-place sum of n floats over all ranks.
  absl::Status AllReduceSum(float* data, int64_t n, cudaEvent_t after);
  // Blocks until everything enqueued so far has completed; DeadlineExceeded (and the
  // communicator aborted) after `timeout_s`, as on NCCL's asynchronous error.
  absl::Status Wait(double timeout_s);
  // Records the completion of what is enqueued so far, for a compute stream to wait on.
  absl::StatusOr<cudaEvent_t> Done();

 private:
  NcclComm() = default;
  // A call's result: the communicator is nonblocking, so a call may return ncclInProgress, and
  // its state must be ncclSuccess before the next call; polled until it is, or aborted at
  // timeout_s_ or on an NCCL error.
  absl::Status Settle(ncclResult_t called, const char* what);

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  int rank_ = 0, size_ = 1, device_ = 0;
  double timeout_s_ = 300;  // Create's: the initialisation's and each call's
  bool aborted_ = false;
};

}  // namespace freeride::pipeline
