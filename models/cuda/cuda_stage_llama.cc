// A Llama-family layer of a CUDA chunk: the same sequence as LlamaStage on the CPU
// (models/llama.cc), on device buffers named as GPT-2's (cuda_stage.h: fch holds SwiGLU's input
// [BT, 2F], fch_gelu its output [BT, F]). Attention runs the reference path of
// cuda_stage_passes.cc with the grouped-query heads of llama_kernels.h; the weight products of
// LlamaLayerBackwardWeight write with beta = 0 after ZeroGrads, as GPT-2's do.
#include "core/cuda_check.h"
#include "models/cuda/cuda_stage.h"
#include "models/cuda/llama_kernels.h"

namespace freeride::cuda {

template <typename T>
absl::Status CudaStage<T>::LlamaLayerForward(const Slot& s, int64_t l, const T* x) {
  const GPT2Config& cfg = layout_.config;
  const int64_t BT = B_ * T_, C = cfg.n_embd, BTC = BT * C, F = cfg.ffn_hidden;
  const int64_t hs = cfg.head_size(), heads = cfg.n_head + cfg.n_kv_head;
  const float eps = static_cast<float>(cfg.norm_eps);
  using PT = ParamTensor;
  T* ln1 = Act(s.ln1, l, BTC);
  T* qkv = Act(s.qkv, l, BT * widths_.qkv);
  T* res2 = Act(s.residual2, l, BTC);
  T* ln2 = Act(s.ln2, l, BTC);
  T* h = Act(s.fch, l, BT * widths_.fc);
  T* act = ActivationOutput(s, l);
  T* tmp = Ptr<T>(ids_.scratch_c);
  FR_KERNEL(l, RMSNormForward, ln1, Stat(s.ln1_rstd, l), x, P(PT::kLn1W, l), eps, BT, C, stream_);
  FR_LIBRARY(l, MatmulForward<T>, blas_, qkv, ln1, P(PT::kQkvW, l), nullptr, BT, C, widths_.qkv);
  // q and k heads are adjacent at the start of each row: one rotation covers both, and qkv
  // keeps them rotated (what attention read, and what its backward recomputes from).
  FR_KERNEL(l, RopeInPlace, qkv, Ptr<float>(ids_.rope_cos), Ptr<float>(ids_.rope_sin), B_, T_,
            heads, hs, widths_.qkv, false, stream_);
  FR_RETURN_IF_ERROR(AttentionForward(s, l));
  FR_LIBRARY(l, MatmulForward<T>, blas_, tmp, Act(s.atty, l, BTC), P(PT::kAttProjW, l), nullptr, BT,
             C, C);
  FR_KERNEL(l, ResidualForward, res2, x, tmp, BTC, stream_);
  FR_KERNEL(l, RMSNormForward, ln2, Stat(s.ln2_rstd, l), res2, P(PT::kLn2W, l), eps, BT, C,
            stream_);
  FR_LIBRARY(l, MatmulForward<T>, blas_, h, ln2, P(PT::kFcW, l), nullptr, BT, C, 2 * F);
  FR_KERNEL(l, SwiGluForward, act, h, BT, F, stream_);
  FR_LIBRARY(l, MatmulForward<T>, blas_, tmp, act, P(PT::kFcProjW, l), nullptr, BT, F, C);
  FR_KERNEL(l, ResidualForward, Act(s.residual3, l, BTC), res2, tmp, BTC, stream_);
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::LlamaLayerBackwardInput(const Slot& s, int64_t l, const T* x, T* dx) {
  const GPT2Config& cfg = layout_.config;
  const int64_t BT = B_ * T_, C = cfg.n_embd, BTC = BT * C, F = cfg.ffn_hidden;
  const int64_t hs = cfg.head_size(), heads = cfg.n_head + cfg.n_kv_head;
  using PT = ParamTensor;
  const T* dres3 = BlockOutputGrad(s, l);
  T* dh = Act(s.dfch, l, BT * widths_.fc);
  T* dln2 = Act(s.dln2, l, BTC);
  T* dres2 = Act(s.dres2, l, BTC);
  T* dqkv = Act(s.dqkv, l, BT * widths_.qkv);
  T* dln1 = Act(s.dln1, l, BTC);
  T* dact = Ptr<T>(ids_.scratch_4c);
  T* datty = Ptr<T>(ids_.scratch_c);
  FR_LIBRARY(l, MatmulBackwardInput<T>, blas_, dact, dres3, P(PT::kFcProjW, l), BT, F, C);
  FR_KERNEL(l, SwiGluBackward, dh, Act(s.fch, l, BT * widths_.fc), dact, BT, F, stream_);
  FR_LIBRARY(l, MatmulBackwardInput<T>, blas_, dln2, dh, P(PT::kFcW, l), BT, C, 2 * F);
  FR_KERNEL(l, Copy, dres2, dres3, BTC, stream_);
  FR_KERNEL(l, RMSNormBackwardInput, dres2, dln2, Act(s.residual2, l, BTC), P(PT::kLn2W, l),
            Stat(s.ln2_rstd, l), BT, C, stream_);
  FR_LIBRARY(l, MatmulBackwardInput<T>, blas_, datty, dres2, P(PT::kAttProjW, l), BT, C, C);
  FR_RETURN_IF_ERROR(AttentionBackward(s, l, datty));
  // The gradient of the rotated q and k, rotated back: the gradient of the projection's output.
  FR_KERNEL(l, RopeInPlace, dqkv, Ptr<float>(ids_.rope_cos), Ptr<float>(ids_.rope_sin), B_, T_,
            heads, hs, widths_.qkv, true, stream_);
  FR_LIBRARY(l, MatmulBackwardInput<T>, blas_, dln1, dqkv, P(PT::kQkvW, l), BT, C, widths_.qkv);
  FR_KERNEL(l, Copy, dx, dres2, BTC, stream_);
  FR_KERNEL(l, RMSNormBackwardInput, dx, dln1, x, P(PT::kLn1W, l), Stat(s.ln1_rstd, l), BT, C,
            stream_);
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::LlamaLayerBackwardWeight(const Slot& s, int64_t l, const T* x) {
  const GPT2Config& cfg = layout_.config;
  const int64_t BT = B_ * T_, C = cfg.n_embd, BTC = BT * C, F = cfg.ffn_hidden;
  using PT = ParamTensor;
  float* partials = Ptr<float>(ids_.column_partials);
  const bool acc = !weight_grads_deferred_;  // beta = 0 over what ZeroGrads left
  if (recompute(Recompute::kSelective)) FR_RETURN_IF_ERROR(RecomputeActivation(s, l));
  FR_LIBRARY(l, MatmulBackwardWeight<T>, blas_, G(PT::kFcProjW, l), BlockOutputGrad(s, l),
             ActivationOutput(s, l), BT, F, C, acc);
  FR_LIBRARY(l, MatmulBackwardWeight<T>, blas_, G(PT::kFcW, l), Act(s.dfch, l, BT * widths_.fc),
             Act(s.ln2, l, BTC), BT, C, 2 * F, acc);
  FR_KERNEL(l, RMSNormBackwardWeight, G(PT::kLn2W, l), Act(s.dln2, l, BTC),
            Act(s.residual2, l, BTC), Stat(s.ln2_rstd, l), BT, C, partials, stream_);
  FR_LIBRARY(l, MatmulBackwardWeight<T>, blas_, G(PT::kAttProjW, l), Act(s.dres2, l, BTC),
             Act(s.atty, l, BTC), BT, C, C, acc);
  FR_LIBRARY(l, MatmulBackwardWeight<T>, blas_, G(PT::kQkvW, l), Act(s.dqkv, l, BT * widths_.qkv),
             Act(s.ln1, l, BTC), BT, C, widths_.qkv, acc);
  FR_KERNEL(l, RMSNormBackwardWeight, G(PT::kLn1W, l), Act(s.dln1, l, BTC), x, Stat(s.ln1_rstd, l),
            BT, C, partials, stream_);
  return absl::OkStatus();
}

// The members defined here, for both element types (the class itself is instantiated in
// cuda_stage_model.cc).
#define FR_INSTANTIATE(T)                                                                          \
  template absl::Status CudaStage<T>::LlamaLayerForward(const Slot&, int64_t, const T*);           \
  template absl::Status CudaStage<T>::LlamaLayerBackwardInput(const Slot&, int64_t, const T*, T*); \
  template absl::Status CudaStage<T>::LlamaLayerBackwardWeight(const Slot&, int64_t, const T*);
FR_INSTANTIATE(float)
FR_INSTANTIATE(bf16)
#undef FR_INSTANTIATE

}  // namespace freeride::cuda
