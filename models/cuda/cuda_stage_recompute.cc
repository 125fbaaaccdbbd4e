// Activation recomputation in a CUDA chunk (model.recompute; what each mode keeps: StageBufferIds
// in models/device_memory_plan.h). What is made again is made by the forward's own kernels and
// products on the forward's own inputs, in the forward's order, so it is the same bits: losses
// and gradients do not depend on the mode.
#include "core/cuda_check.h"
#include "models/cuda/cuda_stage.h"
#include "models/cuda/elementwise.h"
#include "models/cuda/llama_kernels.h"

namespace freeride::cuda {

// The forward writes each block's output into the slot's residual3 again, and a redo of the
// input gradients the slot's dinput: the same bits as are there, which nobody reads meanwhile
// (messages are copied out before their call returns).
template <typename T>
absl::Status CudaStage<T>::RecomputeBlocks(int slot, bool input_grads) {
  const Slot& s = ids_.slots[slot];
  const int64_t L = layout_.stage.num_layers(), BTC = B_ * T_ * layout_.config.n_embd;
  for (int64_t l = 0; l < L; ++l) {
    FR_RETURN_IF_ERROR(llama() ? LlamaLayerForward(s, l, LayerInput(s, l))
                               : LayerForward(s, l, LayerInput(s, l)));
  }
  if (input_grads) {
    // From the slot's output gradient, kept since its BackwardInput; the LayerNorm weight
    // gradients that BackwardInput already summed are not summed twice.
    for (int64_t l = L - 1; l >= 0; --l) {
      T* dx = l == 0 ? Ptr<T>(s.dinput) : Act(s.dres3, l - 1, BTC);
      FR_RETURN_IF_ERROR(llama() ? LlamaLayerBackwardInput(s, l, LayerInput(s, l), dx)
                                 : LayerBackwardInput(s, l, LayerInput(s, l), dx, false));
    }
  }
  recomputed_slot_ = slot;
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::RecomputeActivation(const Slot& s, int64_t l) {
  const int64_t BT = B_ * T_, C = layout_.config.n_embd;
  T* out = Ptr<T>(ids_.scratch_4c);
  const T* h = Act(s.fch, l, BT * widths_.fc);
  if (llama()) {
    FR_KERNEL(l, SwiGluForward, out, h, BT, layout_.config.ffn_hidden, stream_);
  } else if (fuse_gelu_) {
    // The GELU inside the product's epilogue: the product again. Its pre-GELU output goes over
    // the slot's fch, dead since the slot's BackwardInput read it (and the same bits).
    FR_LIBRARY(l, MatmulForward, blas_, out, Act(s.ln2, l, BT * C), P(ParamTensor::kFcW, l),
               P(ParamTensor::kFcB, l), BT, C, 4 * C, GeluFusion::kForward,
               Act(s.fch, l, BT * widths_.fc));
  } else if (fused_kernels_) {
    FR_KERNEL(l, VectorGeluForward, out, h, BT * widths_.act, stream_);
  } else {
    FR_KERNEL(l, GeluForward, out, h, BT * widths_.act, stream_);
  }
  return absl::OkStatus();
}

#define FR_INSTANTIATE(T)                                         \
  template absl::Status CudaStage<T>::RecomputeBlocks(int, bool); \
  template absl::Status CudaStage<T>::RecomputeActivation(const Slot&, int64_t);
FR_INSTANTIATE(float)
FR_INSTANTIATE(bf16)
#undef FR_INSTANTIATE

}  // namespace freeride::cuda
