// ZeRO-1 (parallel.zero = 1) on a CUDA chunk: the AdamW moments of this data-parallel rank's
// share only (the optimizer phase planned again at the share's size and the whole one freed),
// the gradient norm's chunk sums of the share and their combination in the order zero = 0's
// fused norm adds them, and the parameters' all-gather's two sides: through the host (MPI) or
// in place on the device (NCCL).
#include <algorithm>
#include <type_traits>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/cuda_check.h"
#include "core/logging.h"
#include "core/status.h"
#include "models/cuda/cuda_stage.h"
#include "models/cuda/multi_tensor.h"

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
absl::Status CudaStage<T>::ShardOptimizerState(std::vector<ParamRange> ranges) {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("ShardOptimizerState"));
  if (sharded_) return absl::FailedPreconditionError("the optimizer state is sharded already");
  FR_RETURN_IF_ERROR(CheckTableIsNormPlan(layout_, table_));
  int64_t held = 0;
  for (const ParamRange& r : ranges) {
    if (r.offset < 0 || r.n < 0 || r.offset + r.n > layout_.total) {
      return absl::InvalidArgumentError(
          absl::StrFormat("a ZeRO-1 share [%d, %d) outside the chunk's %d parameters", r.offset,
                          r.offset + r.n, layout_.total));
    }
    FR_RETURN_IF_ERROR(TensorAt(layout_, r).status());
    held += r.n;
  }
  const std::vector<TensorChunk> table = MakeShareTable(layout_, ranges);
  MemoryPlan plan;
  const StageBufferIds ids =
      PlanStageMemory(layout_.config, layout_.stage, B_, T_, slots(), static_cast<int>(sizeof(T)),
                      &plan, true, options_.attention, options_.recompute,
                      OptimizerShare{held, static_cast<int64_t>(table.size())});
  for (int p = 0; p < kNumMemoryPhases; ++p) {
    const MemoryPhase phase = static_cast<MemoryPhase>(p);
    if (phase != MemoryPhase::kOptimizer && plan.PhaseBytes(phase) != plan_.PhaseBytes(phase)) {
      return absl::InternalError(
          absl::StrFormat("the ZeRO-1 plan changes the %s phase, not only the optimizer's",
                          MemoryPhaseName(phase)));
    }
  }
  // The share's moments (zeros before the first step, else what the whole ones held there)
  // into a fresh optimizer phase; then the whole one goes back to the device.
  const int opt = static_cast<int>(MemoryPhase::kOptimizer);
  char* fresh = nullptr;
  if (plan.PhaseBytes(MemoryPhase::kOptimizer) > 0) {
    FR_RETURN_IF_ERROR(DeviceAlloc(&fresh, plan.PhaseBytes(MemoryPhase::kOptimizer)));
    CUDA_CHECK(cudaMemsetAsync(fresh, 0, plan.PhaseBytes(MemoryPhase::kOptimizer), stream_));
  }
  auto at = [&](char* base, int id) {
    return reinterpret_cast<float*>(base + plan.buffer(id).offset);
  };
  int64_t packed = 0;
  for (const ParamRange& r : ranges) {
    if (r.n == 0) continue;
    CUDA_CHECK(cudaMemcpyAsync(at(fresh, ids.adam_m) + packed, Ptr<float>(ids_.adam_m) + r.offset,
                               r.n * 4, cudaMemcpyDeviceToDevice, stream_));
    CUDA_CHECK(cudaMemcpyAsync(at(fresh, ids.adam_v) + packed, Ptr<float>(ids_.adam_v) + r.offset,
                               r.n * 4, cudaMemcpyDeviceToDevice, stream_));
    packed += r.n;
  }
  if (!table.empty()) {
    CUDA_CHECK(cudaMemcpyAsync(fresh + plan.buffer(ids.share_table).offset, table.data(),
                               table.size() * sizeof(TensorChunk), cudaMemcpyHostToDevice,
                               stream_));
  }
  FR_RETURN_IF_ERROR(Sync());  // the copies read the old phase and the host table
  if (base_[opt] != nullptr) CUDA_CHECK(cudaFree(base_[opt]));
  base_[opt] = fresh;
  plan_ = std::move(plan);
  ids_ = ids;
  char* host_params = nullptr;
  FR_RETURN_IF_ERROR(PinnedAlloc(&host_params, layout_.total * sizeof(float)));
  host_params_ = reinterpret_cast<float*>(host_params);
  share_ = std::move(ranges);
  share_elements_ = held;
  share_chunks_ = static_cast<int64_t>(table.size());
  sharded_ = true;
  FR_LOG(INFO) << description_ << ": ZeRO-1 share of " << held << " of " << layout_.total
               << " parameters' moments; device memory: " << plan_.Report();
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
    return absl::FailedPreconditionError(Describe() + ": host parameters exist under ZeRO-1 only");
  }
  CUDA_CHECK(cudaMemcpyAsync(host_params_ + offset, Ptr<float>(ids_.master) + offset, n * 4,
                             cudaMemcpyDeviceToHost, stream_));
  FR_RETURN_IF_ERROR(Sync());
  return host_params_ + offset;
}

template <typename T>
absl::Status CudaStage<T>::CommitHostParams(int64_t offset, int64_t n) {
  FR_RETURN_IF_ERROR(Enter());
  if (host_params_ == nullptr) {
    return absl::FailedPreconditionError(Describe() + ": host parameters exist under ZeRO-1 only");
  }
  CUDA_CHECK(cudaMemcpyAsync(Ptr<float>(ids_.master) + offset, host_params_ + offset, n * 4,
                             cudaMemcpyHostToDevice, stream_));
  if constexpr (!std::is_same_v<T, float>) {  // the compute copy rounded as AdamW rounds it
    FR_KERNEL(kWholeChunk, Convert, Ptr<bf16>(ids_.compute) + offset,
              Ptr<float>(ids_.master) + offset, n, stream_);
  }
  return Sync();
}

template <typename T>
absl::StatusOr<float*> CudaStage<T>::DeviceParams(int64_t offset, int64_t n) {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("DeviceParams"));
  if (offset < 0 || n < 0 || offset + n > layout_.total) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "device parameters [%d, %d) outside the chunk's %d", offset, offset + n, layout_.total));
  }
  return Ptr<float>(ids_.master) + offset;
}

template <typename T>
absl::Status CudaStage<T>::CommitDeviceParams(int64_t offset, int64_t n) {
  FR_RETURN_IF_ERROR(Enter());
  if constexpr (!std::is_same_v<T, float>) {  // the compute copy rounded as AdamW rounds it
    FR_KERNEL(kWholeChunk, Convert, Ptr<bf16>(ids_.compute) + offset,
              Ptr<float>(ids_.master) + offset, n, stream_);
  }
  return absl::OkStatus();
}

#define FR_INSTANTIATE(T)                                                                        \
  template absl::Status CudaStage<T>::ShardOptimizerState(std::vector<ParamRange>);              \
  template absl::Status CudaStage<T>::ShardGradSquares(const std::vector<ParamRange>&, double*); \
  template absl::StatusOr<std::vector<double>> CudaStage<T>::CombineGradSquares(const double*);  \
  template absl::StatusOr<float*> CudaStage<T>::HostParams(int64_t, int64_t);                    \
  template absl::Status CudaStage<T>::CommitHostParams(int64_t, int64_t);                        \
  template absl::StatusOr<float*> CudaStage<T>::DeviceParams(int64_t, int64_t);                  \
  template absl::Status CudaStage<T>::CommitDeviceParams(int64_t, int64_t);
FR_INSTANTIATE(float)
FR_INSTANTIATE(bf16)
#undef FR_INSTANTIATE

}  // namespace freeride::cuda
