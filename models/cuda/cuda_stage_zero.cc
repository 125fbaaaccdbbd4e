// ZeRO-1 (parallel.zero = 1) on a CUDA chunk: the AdamW moments of this data-parallel rank's
// share only, and in bf16 the fp32 master copy of it (planned so from the start, or planned
// again at the share's size and the whole phases freed), the gradient norm's chunk sums of the
// share and their combination in the order zero = 0's fused norm adds them, and the all-gather
// of the weights the forward reads (fp32, or the bf16 copy each owner's step rounds from its
// master: zero = 0's bits) on its two sides: through the host (MPI) or in place on the device
// (NCCL).
#include <algorithm>
#include <type_traits>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/cuda_check.h"
#include "core/logging.h"
#include "core/status.h"
#include "models/cuda/cuda_stage.h"
#include "models/cuda/multi_tensor.h"
#include "models/stage_message.h"

namespace freeride::cuda {
namespace {

// The multi-tensor table's counted chunks are the gradient norm's chunks (models/grad_norm.h),
// in the same order: the chunk sums the data-parallel group adds are then at the places
// PlanGradNorm gives them. Both cut each slice from its start into kNormChunk elements; this
// checks it for the layout at hand rather than trusting it.
absl::Status CheckTableIsNormPlan(const ParamLayout& layout, const MultiTensorTable& table) {
  const NormPlan plan = PlanGradNorm(layout);
  bool same = plan.chunks == table.counted_chunks() && kNormChunk == kChunkElements;
  for (const NormSlice& slice : plan.slices) {
    for (int64_t c = 0; same && c < NormChunks(slice.n); ++c) {
      same = table.chunks[slice.first_chunk + c].offset == slice.offset + c * kNormChunk;
    }
  }
  if (same) return absl::OkStatus();
  return absl::InternalError(
      "the multi-tensor table's chunks are not the gradient norm's (models/grad_norm.h): a "
      "ZeRO-1 norm would add other sums");
}

}  // namespace

template <typename T>
absl::Status CudaStage<T>::CheckShare(const std::vector<ParamRange>& ranges) const {
  FR_RETURN_IF_ERROR(CheckTableIsNormPlan(layout_, table_));
  for (const ParamRange& r : ranges) {
    if (r.offset < 0 || r.n < 0 || r.offset + r.n > layout_.total) {
      return absl::InvalidArgumentError(
          absl::StrFormat("a ZeRO-1 share [%d, %d) outside the chunk's %d parameters", r.offset,
                          r.offset + r.n, layout_.total));
    }
    FR_RETURN_IF_ERROR(TensorAt(layout_, r).status());
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::UploadShareTable(const std::vector<ParamRange>& ranges,
                                            const MemoryPlan& plan, const StageBufferIds& ids,
                                            char* optimizer) {
  const std::vector<TensorChunk> table = MakeShareTable(layout_, ranges);
  if (!table.empty()) {
    CUDA_CHECK(cudaMemcpyAsync(optimizer + plan.buffer(ids.share_table).offset, table.data(),
                               table.size() * sizeof(TensorChunk), cudaMemcpyHostToDevice,
                               stream_));
  }
  share_elements_ = 0;
  for (const ParamRange& r : ranges) share_elements_ += r.n;
  share_chunks_ = static_cast<int64_t>(table.size());
  return Sync();  // the copy reads the host table
}

template <typename T>
absl::Status CudaStage<T>::AllocateHostGather() {
  char* host = nullptr;
  FR_RETURN_IF_ERROR(PinnedAlloc(&host, layout_.total * sizeof(float)));
  host_params_ = reinterpret_cast<float*>(host);
  if constexpr (!std::is_same_v<T, float>) {  // the compute copy, widened into host_params_
    FR_RETURN_IF_ERROR(PinnedAlloc(&host, layout_.total * sizeof(uint16_t)));
    host_compute_ = reinterpret_cast<uint16_t*>(host);
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::ShardOptimizerState(std::vector<ParamRange> ranges) {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("ShardOptimizerState"));
  if (share_unconfirmed_) {  // made sharded (CudaStageOptions::zero_share)
    if (ranges != share_) {
      return absl::InvalidArgumentError(
          Describe() + ": ZeRO-1 share other than the one the chunk was made with");
    }
    share_unconfirmed_ = false;
    return absl::OkStatus();
  }
  if (sharded_) return absl::FailedPreconditionError("the optimizer state is sharded already");
  FR_RETURN_IF_ERROR(CheckShare(ranges));
  int64_t held = 0;
  for (const ParamRange& r : ranges) held += r.n;
  MemoryPlan plan;
  const StageBufferIds ids = PlanStageMemory(
      layout_.config, layout_.stage, B_, T_, slots(), static_cast<int>(sizeof(T)), &plan, true,
      options_.attention, options_.recompute, OptimizerShare{held, ShareTableChunks(ranges)});
  // In bf16 the master leaves the parameters' phase for the optimizer's.
  const int opt = static_cast<int>(MemoryPhase::kOptimizer);
  const int par = static_cast<int>(MemoryPhase::kParameters);
  for (int p = 0; p < kNumMemoryPhases; ++p) {
    if (p != opt && p != par &&
        plan.PhaseBytes(static_cast<MemoryPhase>(p)) !=
            plan_.PhaseBytes(static_cast<MemoryPhase>(p))) {
      return absl::InternalError(
          absl::StrFormat("the ZeRO-1 plan changes the %s phase, not only the optimizer's",
                          MemoryPhaseName(static_cast<MemoryPhase>(p))));
    }
  }
  // The share's moments and master (zeros before the first step, else what the whole ones
  // held there) into a fresh optimizer phase, the compute copy into a fresh parameters phase
  // where that shrank; then the whole ones go back to the device.
  char* fresh = nullptr;
  if (plan.PhaseBytes(MemoryPhase::kOptimizer) > 0) {
    FR_RETURN_IF_ERROR(DeviceAlloc(&fresh, plan.PhaseBytes(MemoryPhase::kOptimizer)));
    CUDA_CHECK(cudaMemsetAsync(fresh, 0, plan.PhaseBytes(MemoryPhase::kOptimizer), stream_));
  }
  const bool params_shrink =
      plan.PhaseBytes(MemoryPhase::kParameters) != plan_.PhaseBytes(MemoryPhase::kParameters);
  char* fresh_params = base_[par];
  if (params_shrink) {
    FR_RETURN_IF_ERROR(DeviceAlloc(&fresh_params, plan.PhaseBytes(MemoryPhase::kParameters)));
    CUDA_CHECK(cudaMemcpyAsync(fresh_params + plan.buffer(ids.compute).offset,
                               Ptr<char>(ids_.compute), plan.buffer(ids.compute).bytes,
                               cudaMemcpyDeviceToDevice, stream_));
  }
  auto at = [&](char* base, int id) {
    return reinterpret_cast<float*>(base + plan.buffer(id).offset);
  };
  int64_t packed = 0;
  for (const ParamRange& r : ranges) {
    if (r.n == 0) continue;
    std::vector<std::pair<int, int>> moved = {{ids.adam_m, ids_.adam_m}, {ids.adam_v, ids_.adam_v}};
    if (ids.master_sharded) moved.push_back({ids.master, ids_.master});
    for (const auto& [to, from] : moved) {
      CUDA_CHECK(cudaMemcpyAsync(at(fresh, to) + packed, Ptr<float>(from) + r.offset, r.n * 4,
                                 cudaMemcpyDeviceToDevice, stream_));
    }
    packed += r.n;
  }
  FR_RETURN_IF_ERROR(UploadShareTable(ranges, plan, ids, fresh));  // waits for the copies
  if (base_[opt] != nullptr) CUDA_CHECK(cudaFree(base_[opt]));
  base_[opt] = fresh;
  if (params_shrink) {
    CUDA_CHECK(cudaFree(base_[par]));
    base_[par] = fresh_params;
  }
  plan_ = std::move(plan);
  ids_ = ids;
  if (options_.zero_host_gather) FR_RETURN_IF_ERROR(AllocateHostGather());
  share_ = std::move(ranges);
  sharded_ = true;
  FR_LOG(INFO) << description_ << ": ZeRO-1 share of " << held << " of " << layout_.total
               << " parameters' moments" << (ids_.master_sharded ? " and fp32 master" : "")
               << "; device memory: " << plan_.Report();
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::ShardGradSquares(const std::vector<ParamRange>& ranges,
                                            double* partials) {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("ShardGradSquares"));
  FR_RETURN_IF_ERROR(ZeroDeferredGrads(/*head=*/true, 0, layout_.total));
  // Every counted chunk's sum (the kernel zero = 0's fused norm runs), of which the share's
  // are kept: the others are of gradients this rank did not sum.
  const int64_t counted = table_.counted_chunks();
  double* device = Ptr<double>(ids_.multi_tensor_partials);
  FR_KERNEL(kWholeChunk, MultiTensorChunkSquares, device, Ptr<float>(ids_.grads),
            Ptr<TensorChunk>(ids_.multi_tensor_table), counted, stream_);
  std::vector<double> sums(counted);
  CUDA_CHECK(cudaMemcpyAsync(sums.data(), device, counted * sizeof(double), cudaMemcpyDeviceToHost,
                             stream_));
  FR_RETURN_IF_ERROR(Sync());
  // The ranges merged where they touch (a tensor cut between two buckets), ascending.
  std::vector<ParamRange> held = ranges;
  std::sort(held.begin(), held.end(),
            [](const ParamRange& a, const ParamRange& b) { return a.offset < b.offset; });
  std::vector<ParamRange> merged;
  for (const ParamRange& r : held) {
    if (!merged.empty() && merged.back().offset + merged.back().n == r.offset) {
      merged.back().n += r.n;
    } else if (r.n > 0) {
      merged.push_back(r);
    }
  }
  for (int64_t i = 0; i < counted; ++i) {
    const int64_t lo = table_.chunks[i].offset, n = table_.chunks[i].elements;
    auto it = std::upper_bound(merged.begin(), merged.end(), lo,
                               [](int64_t x, const ParamRange& r) { return x < r.offset; });
    if (it == merged.begin()) continue;
    const ParamRange& r = *std::prev(it);
    if (lo >= r.offset + r.n) continue;
    if (lo + n > r.offset + r.n) {
      return absl::InternalError(absl::StrFormat(
          "a ZeRO-1 share ends inside a gradient-norm chunk ([%d, %d)): the shares must keep "
          "every chunk whole",
          lo, lo + n));
    }
    partials[i] = sums[i];
  }
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<std::vector<double>> CudaStage<T>::CombineGradSquares(const double* partials) {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("CombineGradSquares"));
  // The summed chunk sums where the fused norm leaves its partials, combined by its kernel:
  // the units of GradSquaresByUnit over the summed gradients, bit for bit (runtime.kernels =
  // "reference" sums each tensor whole instead: its norm differs from this in rounding).
  const int64_t counted = table_.counted_chunks(), units = table_.units();
  double* device = Ptr<double>(ids_.multi_tensor_partials);
  CUDA_CHECK(
      cudaMemcpyAsync(device, partials, counted * sizeof(double), cudaMemcpyHostToDevice, stream_));
  double* out = Ptr<double>(ids_.reduce_partials) + kReduceBlocks;
  const char* table = Ptr<char>(ids_.multi_tensor_table);
  FR_KERNEL(kWholeChunk, MultiTensorCombineUnits, out, device,
            reinterpret_cast<const int32_t*>(
                table + UnitBeginOffsetBytes(static_cast<int64_t>(table_.chunks.size()))),
            units, stream_);
  std::vector<double> result(units);
  CUDA_CHECK(
      cudaMemcpyAsync(result.data(), out, units * sizeof(double), cudaMemcpyDeviceToHost, stream_));
  FR_RETURN_IF_ERROR(Sync());
  return result;
}

template <typename T>
absl::StatusOr<float*> CudaStage<T>::HostParams(int64_t offset, int64_t n) {
  FR_RETURN_IF_ERROR(Enter());
  if (host_params_ == nullptr) {
    return absl::FailedPreconditionError(
        Describe() + ": host parameters exist under ZeRO-1 through host memory only");
  }
  if constexpr (std::is_same_v<T, float>) {
    CUDA_CHECK(cudaMemcpyAsync(host_params_ + offset, Ptr<float>(ids_.master) + offset, n * 4,
                               cudaMemcpyDeviceToHost, stream_));
    FR_RETURN_IF_ERROR(Sync());
  } else {  // the weights the forward reads, widened: the owner's rounding of its master
    CUDA_CHECK(cudaMemcpyAsync(host_compute_ + offset, Ptr<bf16>(ids_.compute) + offset, n * 2,
                               cudaMemcpyDeviceToHost, stream_));
    FR_RETURN_IF_ERROR(Sync());
    for (int64_t i = offset; i < offset + n; ++i) host_params_[i] = FloatOfBf16(host_compute_[i]);
  }
  return host_params_ + offset;
}

template <typename T>
absl::Status CudaStage<T>::CommitHostParams(int64_t offset, int64_t n) {
  FR_RETURN_IF_ERROR(Enter());
  if (host_params_ == nullptr) {
    return absl::FailedPreconditionError(
        Describe() + ": host parameters exist under ZeRO-1 through host memory only");
  }
  if constexpr (std::is_same_v<T, float>) {
    CUDA_CHECK(cudaMemcpyAsync(Ptr<float>(ids_.master) + offset, host_params_ + offset, n * 4,
                               cudaMemcpyHostToDevice, stream_));
  } else {  // widened bf16 values: narrowing them is exact
    for (int64_t i = offset; i < offset + n; ++i) host_compute_[i] = Bf16Bits(host_params_[i]);
    CUDA_CHECK(cudaMemcpyAsync(Ptr<bf16>(ids_.compute) + offset, host_compute_ + offset, n * 2,
                               cudaMemcpyHostToDevice, stream_));
  }
  return Sync();
}

template <typename T>
absl::StatusOr<StageModel::DeviceWeights> CudaStage<T>::DeviceParams(int64_t offset, int64_t n) {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("DeviceParams"));
  if (offset < 0 || n < 0 || offset + n > layout_.total) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "device parameters [%d, %d) outside the chunk's %d", offset, offset + n, layout_.total));
  }
  if constexpr (std::is_same_v<T, float>) {
    return DeviceWeights{Ptr<float>(ids_.master) + offset, false};
  } else {
    return DeviceWeights{Ptr<bf16>(ids_.compute) + offset, true};
  }
}

#define FR_INSTANTIATE(T)                                                                          \
  template absl::Status CudaStage<T>::ShardOptimizerState(std::vector<ParamRange>);                \
  template absl::Status CudaStage<T>::ShardGradSquares(const std::vector<ParamRange>&, double*);   \
  template absl::StatusOr<std::vector<double>> CudaStage<T>::CombineGradSquares(const double*);    \
  template absl::StatusOr<float*> CudaStage<T>::HostParams(int64_t, int64_t);                      \
  template absl::Status CudaStage<T>::CommitHostParams(int64_t, int64_t);                          \
  template absl::StatusOr<StageModel::DeviceWeights> CudaStage<T>::DeviceParams(int64_t, int64_t); \
  template absl::Status CudaStage<T>::CheckShare(const std::vector<ParamRange>&) const;            \
  template absl::Status CudaStage<T>::UploadShareTable(                                            \
      const std::vector<ParamRange>&, const MemoryPlan&, const StageBufferIds&, char*);            \
  template absl::Status CudaStage<T>::AllocateHostGather();
FR_INSTANTIATE(float)
FR_INSTANTIATE(bf16)
#undef FR_INSTANTIATE

}  // namespace freeride::cuda
