#include "pipeline/comm/nccl_settle.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/timer.h"

namespace freeride::pipeline {

ncclResult_t SettleNccl(ncclComm_t comm, ncclResult_t called, double deadline) {
  auto pause = std::chrono::microseconds(10);
  while (called == ncclInProgress && MonotonicSeconds() <= deadline) {
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(500));
    if (const ncclResult_t query = ncclCommGetAsyncError(comm, &called); query != ncclSuccess) {
      return query;
    }
  }
  return called;
}

}  // namespace freeride::pipeline
