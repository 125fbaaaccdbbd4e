// The gradients and the optimizer of a CUDA chunk: zeroing (beta = 0 products write the weight
// matrices' gradients where runtime.kernels = auto, so only the rest is cleared), the head's wte
// gradient folded in, where the sums across ranks read them (the pinned mirror for host
// transports, the device buffer itself for NCCL), the gradient norm's squares
// per unit and AdamW, each over every tensor in one launch (multi_tensor.h) or one launch per
// tensor (the reference, kernels.h).
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/cuda_check.h"
#include "core/status.h"
#include "models/cuda/cuda_stage.h"
#include "models/cuda/multi_tensor.h"
#include "models/gpt2.h"

namespace freeride::cuda {
namespace {

// The tensors whose gradients only the weight products write (MatmulBackwardWeight).
bool IsWeightMatrix(ParamTensor t) {
  return t == ParamTensor::kQkvW || t == ParamTensor::kAttProjW || t == ParamTensor::kFcW ||
         t == ParamTensor::kFcProjW;
}

}  // namespace

template <typename T>
absl::Status CudaStage<T>::ZeroGrads() {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("ZeroGrads"));
  if (!fused()) {
    CUDA_CHECK(cudaMemsetAsync(Ptr<float>(ids_.grads), 0, layout_.total * 4, stream_));
    if (tied_head()) {
      CUDA_CHECK(cudaMemsetAsync(Ptr<float>(ids_.head_wte_grad), 0,
                                 plan_.buffer(ids_.head_wte_grad).bytes, stream_));
    }
    return absl::OkStatus();
  }
  // The weight matrices' gradients and the head's wte gradient are left to the first
  // products, which write them with beta = 0; the rest (accumulated by other kernels) is
  // zeroed here, in runs of adjacent tensors.
  int64_t begin = 0;
  for (const TensorSlot& slot : layout_.slots) {
    if (!slot.present || !IsWeightMatrix(slot.tensor)) continue;
    if (slot.offset > begin) {
      CUDA_CHECK(
          cudaMemsetAsync(Ptr<float>(ids_.grads) + begin, 0, (slot.offset - begin) * 4, stream_));
    }
    begin = slot.offset + slot.elements;
  }
  if (layout_.total > begin) {
    CUDA_CHECK(
        cudaMemsetAsync(Ptr<float>(ids_.grads) + begin, 0, (layout_.total - begin) * 4, stream_));
  }
  weight_grads_deferred_ = layout_.stage.num_layers() > 0;
  head_grad_deferred_ = tied_head();
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::ZeroDeferredGrads(bool head, int64_t offset, int64_t n) {
  bool weights_touched = false;
  for (const TensorSlot& slot : layout_.slots) {
    weights_touched =
        weights_touched || (slot.present && IsWeightMatrix(slot.tensor) &&
                            slot.offset < offset + n && offset < slot.offset + slot.elements);
  }
  if (weight_grads_deferred_ && weights_touched) {
    for (const TensorSlot& slot : layout_.slots) {
      if (!slot.present || !IsWeightMatrix(slot.tensor)) continue;
      CUDA_CHECK(
          cudaMemsetAsync(Ptr<float>(ids_.grads) + slot.offset, 0, slot.elements * 4, stream_));
    }
    weight_grads_deferred_ = false;
  }
  if (head_grad_deferred_ && head) {
    CUDA_CHECK(cudaMemsetAsync(Ptr<float>(ids_.head_wte_grad), 0,
                               plan_.buffer(ids_.head_wte_grad).bytes, stream_));
    head_grad_deferred_ = false;
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::FoldHeadWteGrad() {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("FoldHeadWteGrad"));
  FR_RETURN_IF_ERROR(ZeroDeferredGrads(/*head=*/true, 0, 0));
  if (!tied_head()) return absl::OkStatus();  // an untied head's gradient is kLmHead's already
  const int64_t n = layout_.config.padded_vocab_size * layout_.config.n_embd;
  if (layout_.stage.has_embedding) {
    FR_KERNEL(kHead, AddInPlace, G(ParamTensor::kWte), Ptr<float>(ids_.head_wte_grad), n, stream_);
  } else {
    FR_KERNEL(kHead, Copy, G(ParamTensor::kWte), Ptr<float>(ids_.head_wte_grad), n, stream_);
  }
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<float*> CudaStage<T>::HostGrads(int64_t offset, int64_t n) {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("HostGrads"));
  FR_RETURN_IF_ERROR(ZeroDeferredGrads(/*head=*/false, offset, n));
  CUDA_CHECK(cudaMemcpyAsync(host_grads_ + offset, Ptr<float>(ids_.grads) + offset, n * 4,
                             cudaMemcpyDeviceToHost, stream_));
  if (absl::Status s = Sync(); !s.ok()) return s;
  return host_grads_ + offset;
}

template <typename T>
absl::Status CudaStage<T>::CommitHostGrads(int64_t offset, int64_t n) {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("CommitHostGrads"));
  FR_RETURN_IF_ERROR(ZeroDeferredGrads(/*head=*/false, offset, n));
  CUDA_CHECK(cudaMemcpyAsync(Ptr<float>(ids_.grads) + offset, host_grads_ + offset, n * 4,
                             cudaMemcpyHostToDevice, stream_));
  return Sync();
}

template <typename T>
absl::StatusOr<float*> CudaStage<T>::DeviceGrads(int64_t offset, int64_t n) {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("DeviceGrads"));
  // What ZeroGrads left to products not yet run is zeroed first, on this stream: GradsWritten
  // comes after it.
  FR_RETURN_IF_ERROR(ZeroDeferredGrads(/*head=*/false, offset, n));
  return Ptr<float>(ids_.grads) + offset;
}

template <typename T>
absl::StatusOr<void*> CudaStage<T>::GradsWritten() {
  FR_RETURN_IF_ERROR(Enter());
  CUDA_CHECK(cudaEventRecord(grads_written_, stream_));
  return static_cast<void*>(grads_written_);
}

template <typename T>
absl::StatusOr<bool> CudaStage<T>::SumTiedOnDevice(StageModel& head) {
  auto* other = dynamic_cast<CudaStage<T>*>(&head);
  const int64_t n = TiedElements(layout_.config);
  if (other == nullptr || other->device_ != device_ || n == 0) return false;
  FR_ASSIGN_OR_RETURN(float* theirs,
                      other->DeviceGrads(other->layout_.slot(ParamTensor::kWte).offset, n));
  FR_ASSIGN_OR_RETURN(void* head_written, other->GradsWritten());
  FR_ASSIGN_OR_RETURN(float* mine, DeviceGrads(layout_.slot(ParamTensor::kWte).offset, n));
  // The add after the head's share is made (its stream's event), the copy back after the add.
  CUDA_CHECK(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(head_written), 0));
  FR_KERNEL(kEmbedding, AddInPlace, mine, theirs, n, stream_);
  FR_ASSIGN_OR_RETURN(void* summed, GradsWritten());
  CUDA_CHECK(cudaStreamWaitEvent(other->stream_, static_cast<cudaEvent_t>(summed), 0));
  CUDA_CHECK(
      cudaMemcpyAsync(theirs, mine, n * sizeof(float), cudaMemcpyDeviceToDevice, other->stream_));
  // And this stream after the copy back, which reads `mine`: what writes `mine` next is
  // ordered after this chunk's GradsWritten only (the data-parallel sum in place, on its
  // communicator's stream); ahead of the copy, it handed the head the replicas' sum.
  FR_ASSIGN_OR_RETURN(void* copied, other->GradsWritten());
  CUDA_CHECK(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(copied), 0));
  return true;
}

template <typename T>
absl::StatusOr<std::vector<double>> CudaStage<T>::GradSquaresByUnit() {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("GradSquaresByUnit"));
  FR_RETURN_IF_ERROR(ZeroDeferredGrads(/*head=*/true, 0, layout_.total));
  const GPT2Config& cfg = layout_.config;
  const StageSpec& st = layout_.stage;
  double* partials = Ptr<double>(ids_.reduce_partials);
  double* units = partials + kReduceBlocks;
  int64_t u = 0;
  if (fused()) {  // one launch over every tensor, one combining each unit's partials
    const int64_t n = static_cast<int64_t>(table_.chunks.size());
    const char* table = Ptr<char>(ids_.multi_tensor_table);
    FR_KERNEL(kWholeChunk, MultiTensorGradSquares, units, Ptr<double>(ids_.multi_tensor_partials),
              Ptr<float>(ids_.grads), reinterpret_cast<const TensorChunk*>(table),
              reinterpret_cast<const int32_t*>(table + UnitBeginOffsetBytes(n)),
              table_.counted_chunks(), table_.units(), stream_);
    u = table_.units();
  }
  auto add = [&](int64_t layer, const float* x, int64_t n, bool first) -> absl::Status {
    FR_KERNEL(layer, SumOfSquares, units + u, x, n, !first, partials, stream_);
    return absl::OkStatus();
  };
  if (!fused() && st.has_embedding) {
    FR_RETURN_IF_ERROR(
        add(kEmbedding, G(ParamTensor::kWte), layout_.slot(ParamTensor::kWte).elements, true));
    if (layout_.slot(ParamTensor::kWpe).present) {
      FR_RETURN_IF_ERROR(
          add(kEmbedding, G(ParamTensor::kWpe), layout_.slot(ParamTensor::kWpe).elements, false));
    }
    ++u;
  }
  for (int64_t l = 0; !fused() && l < st.num_layers(); ++l, ++u) {
    bool first = true;
    for (int i = 0; i < kNumParamTensors; ++i) {
      const ParamTensor t = static_cast<ParamTensor>(i);
      if (!IsPerLayer(t) || ParamElements(cfg, t) == 0) continue;  // Llama has no biases
      FR_RETURN_IF_ERROR(add(l, G(t, l), ParamElements(cfg, t), first));
      first = false;
    }
  }
  if (!fused() && st.has_head) {
    FR_RETURN_IF_ERROR(add(kHead, G(ParamTensor::kLnfW), cfg.n_embd, true));
    for (ParamTensor t : {ParamTensor::kLnfB, ParamTensor::kLmHead}) {  // where the family has it
      if (layout_.slot(t).present) {
        FR_RETURN_IF_ERROR(add(kHead, G(t), layout_.slot(t).elements, false));
      }
    }
    ++u;
  }
  std::vector<double> out(u);
  CUDA_CHECK(
      cudaMemcpyAsync(out.data(), units, u * sizeof(double), cudaMemcpyDeviceToHost, stream_));
  if (absl::Status s = Sync(); !s.ok()) return s;
  return out;
}

template <typename T>
absl::Status CudaStage<T>::ApplyAdamW(const AdamWStep& step) {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("ApplyAdamW"));
  FR_RETURN_IF_ERROR(ZeroDeferredGrads(/*head=*/true, 0, layout_.total));
  AdamWArgs a;
  a.lr = static_cast<float>(step.lr);
  a.beta1 = static_cast<float>(step.beta1);
  a.beta2 = static_cast<float>(step.beta2);
  a.eps = static_cast<float>(step.eps);
  a.grad_scale = static_cast<float>(step.grad_scale);
  a.bias_correction1 = static_cast<float>(1.0 - std::pow(step.beta1, double(step.step)));
  a.bias_correction2 = static_cast<float>(1.0 - std::pow(step.beta2, double(step.step)));
  if (sharded_) {  // ZeRO-1: the share's chunks only, their moments (and bf16's master) packed
    a.weight_decay = static_cast<float>(step.weight_decay);
    bf16* compute = nullptr;
    if constexpr (!std::is_same_v<T, float>) compute = Ptr<bf16>(ids_.compute);
    FR_KERNEL(kWholeChunk, MultiTensorAdamW, Ptr<float>(ids_.master), compute,
              Ptr<float>(ids_.grads), Ptr<float>(ids_.adam_m), Ptr<float>(ids_.adam_v),
              Ptr<TensorChunk>(ids_.share_table), share_chunks_, a, stream_, ids_.master_sharded);
    return Sync();
  }
  if (fused()) {  // every tensor in one launch, the decay per chunk from the table
    a.weight_decay = static_cast<float>(step.weight_decay);
    bf16* compute = nullptr;
    if constexpr (!std::is_same_v<T, float>) compute = Ptr<bf16>(ids_.compute);
    FR_KERNEL(kWholeChunk, MultiTensorAdamW, Ptr<float>(ids_.master), compute,
              Ptr<float>(ids_.grads), Ptr<float>(ids_.adam_m), Ptr<float>(ids_.adam_v),
              Ptr<TensorChunk>(ids_.multi_tensor_table), static_cast<int64_t>(table_.chunks.size()),
              a, stream_);
    return Sync();
  }
  for (const TensorSlot& slot : layout_.slots) {
    if (!slot.present) continue;
    a.weight_decay = IsDecayed(slot.tensor) ? static_cast<float>(step.weight_decay) : 0.0f;
    bf16* compute = nullptr;
    if constexpr (!std::is_same_v<T, float>) compute = Ptr<bf16>(ids_.compute) + slot.offset;
    FR_KERNEL(kWholeChunk, AdamW, Ptr<float>(ids_.master) + slot.offset, compute,
              Ptr<float>(ids_.grads) + slot.offset, Ptr<float>(ids_.adam_m) + slot.offset,
              Ptr<float>(ids_.adam_v) + slot.offset, slot.elements, a, stream_);
  }
  return Sync();
}

#define FR_INSTANTIATE(T)                                                         \
  template absl::Status CudaStage<T>::ZeroGrads();                                \
  template absl::Status CudaStage<T>::ZeroDeferredGrads(bool, int64_t, int64_t);  \
  template absl::Status CudaStage<T>::FoldHeadWteGrad();                          \
  template absl::StatusOr<float*> CudaStage<T>::HostGrads(int64_t, int64_t);      \
  template absl::Status CudaStage<T>::CommitHostGrads(int64_t, int64_t);          \
  template absl::StatusOr<float*> CudaStage<T>::DeviceGrads(int64_t, int64_t);    \
  template absl::StatusOr<void*> CudaStage<T>::GradsWritten();                    \
  template absl::StatusOr<bool> CudaStage<T>::SumTiedOnDevice(StageModel&);       \
  template absl::StatusOr<std::vector<double>> CudaStage<T>::GradSquaresByUnit(); \
  template absl::Status CudaStage<T>::ApplyAdamW(const AdamWStep&);
FR_INSTANTIATE(float)
FR_INSTANTIATE(bf16)
#undef FR_INSTANTIATE

}  // namespace freeride::cuda
