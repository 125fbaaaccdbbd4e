// Waiting on a nonblocking NCCL communicator (ncclConfig_t::blocking = 0), which NcclComm and
// the NCCL transport make so that a rank that never comes fails a deadline instead of hanging
// the others: any call on one (its initialisation, a group, a sum) may return ncclInProgress,
// and the communicator's state must be ncclSuccess before the next call on it or its stream.
// Only built with the CUDA backend.
#pragma once

#include <nccl.h>

namespace freeride::pipeline {

// `called`: what the call returned. While it is ncclInProgress, polls the communicator's state
// (ncclCommGetAsyncError) until `deadline` (MonotonicSeconds). Returns the last state:
// ncclSuccess, an NCCL error, or ncclInProgress when the deadline passed first.
ncclResult_t SettleNccl(ncclComm_t comm, ncclResult_t called, double deadline);

}  // namespace freeride::pipeline
