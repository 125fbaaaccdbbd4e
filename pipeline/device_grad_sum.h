// Gradient sums across ranks in place on the device: where the transport carries device memory
// (NCCL) and a chunk keeps its gradients on a device (CUDA), a sum reads and writes the chunk's
// gradient buffer where it is, on the transport's stream after the work the chunk has queued
// (the products that make the gradients), with no copy through the host and no host wait
// before it starts. Otherwise (MPI, the in-process transport, the CPU backend) the sums go
// through the chunk's host copy (StageModel::HostGrads), as they always have.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "models/grad_norm.h"
#include "models/stage_model.h"
#include "pipeline/comm/transport.h"

namespace freeride::pipeline {

// Whether `chunk`'s sums over `transport` run on the device.
inline bool SumsOnDevice(const Transport& transport, const StageModel& chunk) {
  return transport.CarriesDeviceMemory() && chunk.GradsOnDevice();
}

// Starts the sum over `group` of `chunk`'s gradient ranges (layout offsets), in place on its
// device, once what the chunk has queued so far has run (SumsOnDevice must hold). The chunk's
// gradients there are the sums once the request completes; nothing is to be committed.
absl::StatusOr<Transport::Request> StartDeviceGradSum(StageModel& chunk,
                                                      const std::vector<ParamRange>& ranges,
                                                      Transport& transport,
                                                      const std::vector<int>& group);

// ZeRO-1's halves on the device (SumsOnDevice must hold), range i (layout offsets) owned by
// group member roots[i]: kReduce sums the chunk's gradients there in place onto each owner,
// kBroadcast copies the weights its forward reads there (StageModel::DeviceParams: fp32, or
// bf16 rounded by the owner's step) from each owner to every member, both ordered after what
// the chunk has queued so far.
absl::StatusOr<Transport::Request> StartDeviceShares(
    Transport::DeviceRooted kind, StageModel& chunk, const std::vector<ParamRange>& ranges,
    const std::vector<int>& roots, Transport& transport, const std::vector<int>& group);

// Gradients [offset, offset + n) of `chunk` summed over `group`, waited for: on the device where
// SumsOnDevice holds, else through its host copy (HostGrads, CommitHostGrads).
absl::Status SumGrads(StageModel& chunk, int64_t offset, int64_t n, Transport& transport,
                      const std::vector<int>& group, double timeout_s);

}  // namespace freeride::pipeline
