#include "pipeline/device_grad_sum.h"

#include "core/status.h"

namespace freeride::pipeline {

absl::StatusOr<Transport::Request> StartDeviceGradSum(StageModel& chunk,
                                                      const std::vector<ParamRange>& ranges,
                                                      Transport& transport,
                                                      const std::vector<int>& group) {
  std::vector<Transport::DeviceRange> device;
  for (const ParamRange& r : ranges) {
    FR_ASSIGN_OR_RETURN(float* data, chunk.DeviceGrads(r.offset, r.n));
    device.push_back({data, r.n});
  }
  // After DeviceGrads: the zeroing it may queue is among what the sum waits for.
  FR_ASSIGN_OR_RETURN(void* written, chunk.GradsWritten());
  return transport.StartDeviceSum(device, group, written);
}

absl::StatusOr<Transport::Request> StartDeviceShares(
    Transport::DeviceRooted kind, StageModel& chunk, const std::vector<ParamRange>& ranges,
    const std::vector<int>& roots, Transport& transport, const std::vector<int>& group) {
  std::vector<Transport::DeviceRange> device;
  for (const ParamRange& r : ranges) {
    if (kind == Transport::DeviceRooted::kReduce) {
      FR_ASSIGN_OR_RETURN(float* grads, chunk.DeviceGrads(r.offset, r.n));
      device.push_back({grads, r.n});
    } else {
      FR_ASSIGN_OR_RETURN(const StageModel::DeviceWeights weights,
                          chunk.DeviceParams(r.offset, r.n));
      device.push_back({weights.data, r.n, weights.bf16});
    }
  }
  // After DeviceGrads (its zeroing) and the step that wrote the parameters: the event marks
  // everything the chunk has queued.
  FR_ASSIGN_OR_RETURN(void* written, chunk.GradsWritten());
  return transport.StartDeviceRooted(kind, device, roots, group, written);
}

absl::Status SumGrads(StageModel& chunk, int64_t offset, int64_t n, Transport& transport,
                      const std::vector<int>& group, double timeout_s) {
  if (SumsOnDevice(transport, chunk)) {
    FR_ASSIGN_OR_RETURN(Transport::Request r,
                        StartDeviceGradSum(chunk, {{offset, n}}, transport, group));
    return transport.Wait(r, timeout_s);
  }
  FR_ASSIGN_OR_RETURN(float* grads, chunk.HostGrads(offset, n));
  FR_RETURN_IF_ERROR(transport.AllReduceSum(grads, n, group, timeout_s));
  return chunk.CommitHostGrads(offset, n);
}

}  // namespace freeride::pipeline
