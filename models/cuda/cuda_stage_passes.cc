// Forward and backward of a CUDA chunk: the same sequence of layers as GPT2Stage on the CPU
// (models/gpt2.cc), on device buffers, and what both families share: the embedding, the head,
// the attention's reference path (a Llama layer's is cuda_stage_llama.cc's). Attention runs the
// flash kernels (flash_attention.h) where the plan chose them (bf16, shapes they take), else the
// reference path: heads split out, the T × T products batched over heads, softmax kernels.
#include <cmath>
#include <type_traits>

#include "core/cuda_check.h"
#include "models/cuda/column_sums.h"
#include "models/cuda/cuda_stage.h"
#include "models/cuda/elementwise.h"
#include "models/cuda/flash_attention.h"
#include "models/cuda/layernorm.h"
#include "models/cuda/llama_kernels.h"

namespace freeride::cuda {

template <typename T>
const T* CudaStage<T>::LayerInput(const Slot& s, int64_t l) const {
  const int64_t BTC = B_ * T_ * layout_.config.n_embd;
  return l == 0 ? Ptr<T>(s.input) : Ptr<T>(s.residual3) + (l - 1) * BTC;
}
template <typename T>
T* CudaStage<T>::OutputActivations(const Slot& s) const {
  return Ptr<T>(s.residual3) + (layout_.stage.num_layers() - 1) * B_ * T_ * layout_.config.n_embd;
}
template <typename T>
T* CudaStage<T>::OutputGrad(const Slot& s) const {
  if (recompute(Recompute::kFull)) return Ptr<T>(s.out_grad);  // dres3 is shared
  return Ptr<T>(s.dres3) + (layout_.stage.num_layers() - 1) * B_ * T_ * layout_.config.n_embd;
}
template <typename T>
T* CudaStage<T>::BlockOutputGrad(const Slot& s, int64_t l) const {
  if (l == layout_.stage.num_layers() - 1) return OutputGrad(s);
  return Act(s.dres3, l, B_ * T_ * layout_.config.n_embd);
}
template <typename T>
T* CudaStage<T>::ActivationOutput(const Slot& s, int64_t l) const {
  if (recompute(Recompute::kSelective)) return Ptr<T>(ids_.scratch_4c);
  return Act(s.fch_gelu, l, B_ * T_ * widths_.act);
}

// q, k, v are [B·NH] matrices of T × hs; scores [B·NH] of T × T.
// Layer l's q, k, v split into heads (attn_qkv) and their scores q·kᵀ (attn_probs): forward
// turns the scores into probabilities, backward recomputes them, so both must make them alike.
// Grouped-query attention (Llama) copies each query head's key/value head out to it.
template <typename T>
absl::Status CudaStage<T>::AttentionScores(const Slot& s, int64_t l) {
  const GPT2Config& cfg = layout_.config;
  const int64_t C = cfg.n_embd, NH = cfg.n_head, hs = C / NH;
  const int64_t BTC = B_ * T_ * C;
  T* q = Ptr<T>(ids_.attn_qkv);
  const T* qkv = Act(s.qkv, l, B_ * T_ * widths_.qkv);
  if (llama()) {
    FR_KERNEL(l, GqaSplitHeads, q, qkv, B_, T_, NH, cfg.n_kv_head, hs, stream_);
  } else {
    FR_KERNEL(l, SplitHeads, q, qkv, B_, T_, C, NH, stream_);
  }
  FR_LIBRARY(l, BatchedGemm<T>, blas_, false, true, T_, T_, hs, 1.0f, q, hs, T_ * hs, q + BTC, hs,
             T_ * hs, 0.0f, Ptr<T>(ids_.attn_probs), T_, T_ * T_, B_ * NH);
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::AttentionForward(const Slot& s, int64_t l) {
  const int64_t C = layout_.config.n_embd, NH = layout_.config.n_head, hs = C / NH;
  const int64_t BTC = B_ * T_ * C, heads = B_ * NH;
  if constexpr (std::is_same_v<T, bf16>) {
    if (ids_.flash_attention) {  // straight from qkv to the layer's output, no T × T
      FR_KERNEL(l, FlashAttentionForward, Act(s.atty, l, BTC),
                Ptr<float>(s.att_lse) + l * heads * T_, Act(s.qkv, l, B_ * T_ * widths_.qkv), B_,
                T_, NH, KvHeads(), hs, stream_);
      return absl::OkStatus();
    }
  }
  T* v = Ptr<T>(ids_.attn_qkv) + 2 * BTC;
  T* att = Ptr<T>(ids_.attn_probs);
  T* y = Ptr<T>(ids_.attn_y);
  FR_RETURN_IF_ERROR(AttentionScores(s, l));
  FR_KERNEL(l, CausalSoftmaxForward, att, Ptr<float>(s.att_lse) + l * heads * T_,
            1.0f / std::sqrt(static_cast<float>(hs)), heads * T_, T_, stream_);
  FR_LIBRARY(l, BatchedGemm<T>, blas_, false, false, T_, hs, T_, 1.0f, att, T_, T_ * T_, v, hs,
             T_ * hs, 0.0f, y, hs, T_ * hs, heads);
  FR_KERNEL(l, MergeHeads, Act(s.atty, l, BTC), y, B_, T_, C, NH, stream_);
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::LayerForward(const Slot& s, int64_t l, const T* x) {
  const int64_t BT = B_ * T_, C = layout_.config.n_embd, BTC = BT * C;
  using PT = ParamTensor;
  T* ln1 = Act(s.ln1, l, BTC);
  T* qkv = Act(s.qkv, l, 3 * BTC);
  T* res2 = Act(s.residual2, l, BTC);
  T* ln2 = Act(s.ln2, l, BTC);
  T* fch = Act(s.fch, l, 4 * BTC);
  T* fch_gelu = ActivationOutput(s, l);
  T* tmp = Ptr<T>(ids_.scratch_c);
  // Fused kernels: layer l > 0's ln1 was made by layer l − 1, with the residual it reads.
  if (!fused_kernels_) {
    FR_KERNEL(l, LayerNormForward, ln1, Stat(s.ln1_mean, l), Stat(s.ln1_rstd, l), x,
              P(PT::kLn1W, l), P(PT::kLn1B, l), BT, C, stream_);
  } else if (l == 0) {
    FR_KERNEL(l, FusedResidualLayerNormForward<T>, nullptr, ln1, Stat(s.ln1_mean, l),
              Stat(s.ln1_rstd, l), x, nullptr, P(PT::kLn1W, l), P(PT::kLn1B, l), BT, C, stream_);
  }
  FR_LIBRARY(l, MatmulForward, blas_, qkv, ln1, P(PT::kQkvW, l), P(PT::kQkvB, l), BT, C, 3 * C);
  FR_RETURN_IF_ERROR(AttentionForward(s, l));
  FR_LIBRARY(l, MatmulForward, blas_, tmp, Act(s.atty, l, BTC), P(PT::kAttProjW, l),
             P(PT::kAttProjB, l), BT, C, C);
  if (fused_kernels_) {
    FR_KERNEL(l, FusedResidualLayerNormForward<T>, res2, ln2, Stat(s.ln2_mean, l),
              Stat(s.ln2_rstd, l), x, tmp, P(PT::kLn2W, l), P(PT::kLn2B, l), BT, C, stream_);
  } else {
    FR_KERNEL(l, ResidualForward, res2, x, tmp, BTC, stream_);
    FR_KERNEL(l, LayerNormForward, ln2, Stat(s.ln2_mean, l), Stat(s.ln2_rstd, l), res2,
              P(PT::kLn2W, l), P(PT::kLn2B, l), BT, C, stream_);
  }
  if (fuse_gelu_) {
    FR_LIBRARY(l, MatmulForward, blas_, fch_gelu, ln2, P(PT::kFcW, l), P(PT::kFcB, l), BT, C, 4 * C,
               GeluFusion::kForward, fch);
  } else {
    FR_LIBRARY(l, MatmulForward, blas_, fch, ln2, P(PT::kFcW, l), P(PT::kFcB, l), BT, C, 4 * C);
    if (fused_kernels_) {
      FR_KERNEL(l, VectorGeluForward, fch_gelu, fch, 4 * BTC, stream_);
    } else {
      FR_KERNEL(l, GeluForward, fch_gelu, fch, 4 * BTC, stream_);
    }
  }
  FR_LIBRARY(l, MatmulForward, blas_, tmp, fch_gelu, P(PT::kFcProjW, l), P(PT::kFcProjB, l), BT,
             4 * C, C);
  T* res3 = Act(s.residual3, l, BTC);
  if (fused_kernels_ && l + 1 < layout_.stage.num_layers()) {  // and the next layer's ln1
    FR_KERNEL(l, FusedResidualLayerNormForward<T>, res3, Act(s.ln1, l + 1, BTC),
              Stat(s.ln1_mean, l + 1), Stat(s.ln1_rstd, l + 1), res2, tmp, P(PT::kLn1W, l + 1),
              P(PT::kLn1B, l + 1), BT, C, stream_);
  } else if (fused_kernels_) {
    FR_KERNEL(l, VectorResidualForward, res3, res2, tmp, BTC, stream_);
  } else {
    FR_KERNEL(l, ResidualForward, res3, res2, tmp, BTC, stream_);
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::LaunchForward(int slot, double* loss_sum) {
  const Slot& s = ids_.slots[slot];
  const GPT2Config& cfg = layout_.config;
  const int64_t BT = B_ * T_, C = cfg.n_embd;
  // Full: the blocks below write over the shared buffers.
  recomputed_slot_ = -1;
  if (layout_.stage.has_embedding) {  // Llama has no position table: its positions are rotary
    FR_KERNEL(kEmbedding, EncoderForward, Ptr<T>(s.input), Ptr<int32_t>(s.tokens),
              P(ParamTensor::kWte), llama() ? nullptr : P(ParamTensor::kWpe), B_, T_, C, stream_);
  }
  for (int64_t l = 0; l < layout_.stage.num_layers(); ++l) {
    FR_RETURN_IF_ERROR(llama() ? LlamaLayerForward(s, l, LayerInput(s, l))
                               : LayerForward(s, l, LayerInput(s, l)));
  }
  if (!layout_.stage.has_head) return absl::OkStatus();
  FR_RETURN_IF_ERROR(HeadNormForward(s));
  FR_LIBRARY(kHead, MatmulForward<T>, blas_, Ptr<T>(s.logits), Ptr<T>(s.lnf), HeadMatrix(), nullptr,
             BT, C, cfg.padded_vocab_size);
  FR_RETURN_IF_ERROR(ClassifierForward(slot));
  double* partials = Ptr<double>(ids_.reduce_partials);
  double* sum = partials + kReduceBlocks;
  FR_KERNEL(kHead, Sum, sum, Ptr<float>(s.losses), BT, partials, stream_);
  CUDA_CHECK(cudaMemcpyAsync(loss_sum, sum, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::AttentionBackward(const Slot& s, int64_t l, const T* datty) {
  const int64_t C = layout_.config.n_embd, NH = layout_.config.n_head, hs = C / NH;
  const int64_t BTC = B_ * T_ * C, heads = B_ * NH;
  if constexpr (std::is_same_v<T, bf16>) {
    if (ids_.flash_attention) {
      const int64_t qkv = B_ * T_ * widths_.qkv;
      FR_KERNEL(l, FlashAttentionBackward, Act(s.dqkv, l, qkv), Ptr<float>(ids_.attn_rowsum),
                Ptr<T>(ids_.attn_dkv_heads), datty, Act(s.qkv, l, qkv), Act(s.atty, l, BTC),
                Ptr<float>(s.att_lse) + l * heads * T_, B_, T_, NH, KvHeads(), hs, stream_);
      return absl::OkStatus();
    }
  }
  T* q = Ptr<T>(ids_.attn_qkv);
  T* k = q + BTC;
  T* v = k + BTC;
  T* dq = Ptr<T>(ids_.attn_dqkv);
  T* dk = dq + BTC;
  T* dv = dk + BTC;
  T* dy = Ptr<T>(ids_.attn_y);
  T* dscores = Ptr<T>(ids_.attn_scores);
  T* att = Ptr<T>(ids_.attn_probs);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  FR_KERNEL(l, SplitHeadsGrad, dy, datty, B_, T_, C, NH, stream_);
  // The probabilities again, from the scores and forward's log-sum-exp of each row.
  FR_RETURN_IF_ERROR(AttentionScores(s, l));
  FR_KERNEL(l, CausalSoftmaxRecompute, att, Ptr<float>(s.att_lse) + l * heads * T_, scale,
            heads * T_, T_, stream_);
  // datt = dy · vᵀ; dv = attᵀ · dy; then through the softmax; dq = ds · k; dk = dsᵀ · q.
  FR_LIBRARY(l, BatchedGemm<T>, blas_, false, true, T_, T_, hs, 1.0f, dy, hs, T_ * hs, v, hs,
             T_ * hs, 0.0f, dscores, T_, T_ * T_, heads);
  FR_LIBRARY(l, BatchedGemm<T>, blas_, true, false, T_, hs, T_, 1.0f, att, T_, T_ * T_, dy, hs,
             T_ * hs, 0.0f, dv, hs, T_ * hs, heads);
  FR_KERNEL(l, CausalSoftmaxBackward, dscores, att, scale, heads * T_, T_, stream_);
  FR_LIBRARY(l, BatchedGemm<T>, blas_, false, false, T_, hs, T_, 1.0f, dscores, T_, T_ * T_, k, hs,
             T_ * hs, 0.0f, dq, hs, T_ * hs, heads);
  FR_LIBRARY(l, BatchedGemm<T>, blas_, true, false, T_, hs, T_, 1.0f, dscores, T_, T_ * T_, q, hs,
             T_ * hs, 0.0f, dk, hs, T_ * hs, heads);
  T* dqkv = Act(s.dqkv, l, B_ * T_ * widths_.qkv);
  if (llama()) {  // a key/value head's gradient sums its group's
    FR_KERNEL(l, GqaMergeHeadsGrad, dqkv, dq, B_, T_, NH, layout_.config.n_kv_head, hs, stream_);
  } else {
    FR_KERNEL(l, MergeHeadsGrad, dqkv, dq, B_, T_, C, NH, stream_);
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::LayerBackwardInput(const Slot& s, int64_t l, const T* x, T* dx,
                                              bool norm_grads) {
  const int64_t BT = B_ * T_, C = layout_.config.n_embd, BTC = BT * C;
  using PT = ParamTensor;
  const T* dres3 = BlockOutputGrad(s, l);
  T* dfch = Act(s.dfch, l, 4 * BTC);
  T* dln2 = Act(s.dln2, l, BTC);
  T* dres2 = Act(s.dres2, l, BTC);
  T* dln1 = Act(s.dln1, l, BTC);
  T* datty = Ptr<T>(ids_.scratch_c);
  const T* fch = Act(s.fch, l, 4 * BTC);
  if (fuse_gelu_) {
    FR_LIBRARY(l, MatmulBackwardInput, blas_, dfch, dres3, P(PT::kFcProjW, l), BT, 4 * C, C,
               GeluFusion::kBackward, fch);
  } else {
    T* dgelu = Ptr<T>(ids_.scratch_4c);
    FR_LIBRARY(l, MatmulBackwardInput, blas_, dgelu, dres3, P(PT::kFcProjW, l), BT, 4 * C, C);
    if (fused_kernels_) {
      FR_KERNEL(l, VectorGeluBackward, dfch, fch, dgelu, 4 * BTC, stream_);
    } else {
      FR_KERNEL(l, GeluBackward, dfch, fch, dgelu, 4 * BTC, stream_);
    }
  }
  FR_LIBRARY(l, MatmulBackwardInput, blas_, dln2, dfch, P(PT::kFcW, l), BT, C, 4 * C);
  // Fused kernels: LayerNorm's weight gradients here too (LayerBackwardWeight skips them), in
  // the same pass over the rows, and dres2 = dres3 + the gradient without a copy.
  float* partials = Ptr<float>(ids_.column_partials);
  float* discarded = Ptr<float>(ids_.discarded_norm_grads);
  auto norm_grad = [&](PT t) {
    return norm_grads ? G(t, l) : discarded + (t == PT::kLn1B || t == PT::kLn2B ? C : 0);
  };
  if (fused_kernels_) {
    FR_KERNEL(l, FusedLayerNormBackward<T>, dres2, dres3, norm_grad(PT::kLn2W),
              norm_grad(PT::kLn2B), dln2, Act(s.residual2, l, BTC), P(PT::kLn2W, l),
              Stat(s.ln2_mean, l), Stat(s.ln2_rstd, l), BT, C, partials, stream_);
  } else {
    FR_KERNEL(l, Copy, dres2, dres3, BTC, stream_);
    FR_KERNEL(l, LayerNormBackwardInput, dres2, dln2, Act(s.residual2, l, BTC), P(PT::kLn2W, l),
              Stat(s.ln2_mean, l), Stat(s.ln2_rstd, l), BT, C, stream_);
  }
  FR_LIBRARY(l, MatmulBackwardInput, blas_, datty, dres2, P(PT::kAttProjW, l), BT, C, C);
  FR_RETURN_IF_ERROR(AttentionBackward(s, l, datty));
  FR_LIBRARY(l, MatmulBackwardInput, blas_, dln1, Act(s.dqkv, l, 3 * BTC), P(PT::kQkvW, l), BT, C,
             3 * C);
  if (fused_kernels_) {
    FR_KERNEL(l, FusedLayerNormBackward<T>, dx, dres2, norm_grad(PT::kLn1W), norm_grad(PT::kLn1B),
              dln1, x, P(PT::kLn1W, l), Stat(s.ln1_mean, l), Stat(s.ln1_rstd, l), BT, C, partials,
              stream_);
  } else {
    FR_KERNEL(l, Copy, dx, dres2, BTC, stream_);
    FR_KERNEL(l, LayerNormBackwardInput, dx, dln1, x, P(PT::kLn1W, l), Stat(s.ln1_mean, l),
              Stat(s.ln1_rstd, l), BT, C, stream_);
  }
  return absl::OkStatus();
}

template <typename T>
T* CudaStage<T>::HeadMatrix() const {
  return P(TiedElements(layout_.config) > 0 ? ParamTensor::kWte : ParamTensor::kLmHead);
}

template <typename T>
absl::Status CudaStage<T>::HeadNormForward(const Slot& s) {
  const int64_t BT = B_ * T_, C = layout_.config.n_embd;
  if (llama()) {
    FR_KERNEL(kHead, RMSNormForward, Ptr<T>(s.lnf), Ptr<float>(s.lnf_rstd), OutputActivations(s),
              P(ParamTensor::kLnfW), static_cast<float>(layout_.config.norm_eps), BT, C, stream_);
  } else {
    FR_KERNEL(kHead, LayerNormForward, Ptr<T>(s.lnf), Ptr<float>(s.lnf_mean),
              Ptr<float>(s.lnf_rstd), OutputActivations(s), P(ParamTensor::kLnfW),
              P(ParamTensor::kLnfB), BT, C, stream_);
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::HeadNormBackwardInput(const Slot& s, T* dout) {
  const int64_t BT = B_ * T_, C = layout_.config.n_embd;
  if (llama()) {
    FR_KERNEL(kHead, RMSNormBackwardInput, dout, Ptr<T>(s.dlnf), OutputActivations(s),
              P(ParamTensor::kLnfW), Ptr<float>(s.lnf_rstd), BT, C, stream_);
  } else {
    FR_KERNEL(kHead, LayerNormBackwardInput, dout, Ptr<T>(s.dlnf), OutputActivations(s),
              P(ParamTensor::kLnfW), Ptr<float>(s.lnf_mean), Ptr<float>(s.lnf_rstd), BT, C,
              stream_);
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::HeadNormBackwardWeight(const Slot& s) {
  const int64_t BT = B_ * T_, C = layout_.config.n_embd;
  float* partials = Ptr<float>(ids_.column_partials);
  if (llama()) {
    FR_KERNEL(kHead, RMSNormBackwardWeight, G(ParamTensor::kLnfW), Ptr<T>(s.dlnf),
              OutputActivations(s), Ptr<float>(s.lnf_rstd), BT, C, partials, stream_);
  } else {
    FR_KERNEL(kHead, LayerNormBackwardWeight, G(ParamTensor::kLnfW), G(ParamTensor::kLnfB),
              Ptr<T>(s.dlnf), OutputActivations(s), Ptr<float>(s.lnf_mean), Ptr<float>(s.lnf_rstd),
              BT, C, partials, stream_);
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::HeadWteGrad(const Slot& s) {
  const GPT2Config& cfg = layout_.config;
  if (TiedElements(cfg) == 0) {  // untied: ZeroGrads zeroed kLmHead's gradient, so it adds
    FR_LIBRARY(kHead, MatmulBackwardWeight, blas_, G(ParamTensor::kLmHead), Ptr<T>(s.logits),
               Ptr<T>(s.lnf), B_ * T_, cfg.n_embd, cfg.padded_vocab_size, true);
    return absl::OkStatus();
  }
  FR_LIBRARY(kHead, MatmulBackwardWeight, blas_, Ptr<float>(ids_.head_wte_grad), Ptr<T>(s.logits),
             Ptr<T>(s.lnf), B_ * T_, cfg.n_embd, cfg.padded_vocab_size, !head_grad_deferred_);
  head_grad_deferred_ = false;
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::BackwardInput(int slot, float loss_scale) {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("BackwardInput"));
  const Slot& s = ids_.slots[slot];
  const GPT2Config& cfg = layout_.config;
  const int64_t BT = B_ * T_, C = cfg.n_embd, BTC = BT * C, L = layout_.stage.num_layers();
  if (recompute(Recompute::kFull)) FR_RETURN_IF_ERROR(RecomputeBlocks(slot, false));
  if (layout_.stage.has_head) {
    FR_RETURN_IF_ERROR(ClassifierBackward(slot, loss_scale));
    FR_LIBRARY(kHead, MatmulBackwardInput, blas_, Ptr<T>(s.dlnf), Ptr<T>(s.logits), HeadMatrix(),
               BT, C, cfg.padded_vocab_size);
    if (head_grad_in_input_) FR_RETURN_IF_ERROR(HeadWteGrad(s));
    T* dout = OutputGrad(s);
    CUDA_CHECK(cudaMemsetAsync(dout, 0, BTC * sizeof(T), stream_));
    FR_RETURN_IF_ERROR(HeadNormBackwardInput(s, dout));
  }
  for (int64_t l = L - 1; l >= 0; --l) {
    T* dx = l == 0 ? Ptr<T>(s.dinput) : Act(s.dres3, l - 1, BTC);
    FR_RETURN_IF_ERROR(llama() ? LlamaLayerBackwardInput(s, l, LayerInput(s, l), dx)
                               : LayerBackwardInput(s, l, LayerInput(s, l), dx));
  }
  if (recompute(Recompute::kFull)) recomputed_slot_ = slot;
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::LayerBackwardWeight(const Slot& s, int64_t l, const T* x) {
  const int64_t BT = B_ * T_, C = layout_.config.n_embd, BTC = BT * C;
  using PT = ParamTensor;
  float* partials = Ptr<float>(ids_.column_partials);
  const T* dres3 = BlockOutputGrad(s, l);
  const T* dres2 = Act(s.dres2, l, BTC);
  const T* dfch = Act(s.dfch, l, 4 * BTC);
  const T* dqkv = Act(s.dqkv, l, 3 * BTC);
  // Bias gradients: the two-pass column sums of column_sums.h, or the reference's.
  auto bias_backward = [&](float* dbias, const T* dout, int64_t OC) {
    if (fused_kernels_) {
      ColumnSums(dbias, dout, BT, OC, partials, stream_);
    } else {
      BiasBackward(dbias, dout, BT, OC, partials, stream_);
    }
  };
  const bool acc = !weight_grads_deferred_;  // beta = 0 over what ZeroGrads left
  if (recompute(Recompute::kSelective)) FR_RETURN_IF_ERROR(RecomputeActivation(s, l));
  FR_LIBRARY(l, MatmulBackwardWeight, blas_, G(PT::kFcProjW, l), dres3, ActivationOutput(s, l), BT,
             4 * C, C, acc);
  FR_KERNEL(l, bias_backward, G(PT::kFcProjB, l), dres3, C);
  FR_LIBRARY(l, MatmulBackwardWeight, blas_, G(PT::kFcW, l), dfch, Act(s.ln2, l, BTC), BT, C,
             4 * C, acc);
  FR_KERNEL(l, bias_backward, G(PT::kFcB, l), dfch, 4 * C);
  if (!fused_kernels_) {  // else made in LayerBackwardInput
    FR_KERNEL(l, LayerNormBackwardWeight, G(PT::kLn2W, l), G(PT::kLn2B, l), Act(s.dln2, l, BTC),
              Act(s.residual2, l, BTC), Stat(s.ln2_mean, l), Stat(s.ln2_rstd, l), BT, C, partials,
              stream_);
  }
  FR_LIBRARY(l, MatmulBackwardWeight, blas_, G(PT::kAttProjW, l), dres2, Act(s.atty, l, BTC), BT, C,
             C, acc);
  FR_KERNEL(l, bias_backward, G(PT::kAttProjB, l), dres2, C);
  FR_LIBRARY(l, MatmulBackwardWeight, blas_, G(PT::kQkvW, l), dqkv, Act(s.ln1, l, BTC), BT, C,
             3 * C, acc);
  FR_KERNEL(l, bias_backward, G(PT::kQkvB, l), dqkv, 3 * C);
  if (!fused_kernels_) {
    FR_KERNEL(l, LayerNormBackwardWeight, G(PT::kLn1W, l), G(PT::kLn1B, l), Act(s.dln1, l, BTC), x,
              Stat(s.ln1_mean, l), Stat(s.ln1_rstd, l), BT, C, partials, stream_);
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::BackwardWeight(int slot) {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("BackwardWeight"));
  const Slot& s = ids_.slots[slot];
  const GPT2Config& cfg = layout_.config;
  const int64_t C = cfg.n_embd, L = layout_.stage.num_layers();
  // Full: the shared buffers hold another slot's blocks (a W deferred past other work), so
  // this one's are made again first.
  if (recompute(Recompute::kFull) && recomputed_slot_ != slot) {
    FR_RETURN_IF_ERROR(RecomputeBlocks(slot, true));
  }
  // A part is reported once its products are queued: whoever reads its gradients then
  // (HostGrads: a data-parallel bucket's start) copies them on this stream, after them. Not
  // in the first weight gradients after ZeroGrads, written with beta = 0 over stale values: a
  // read there zeroes the matrices first (ZeroDeferredGrads), the ones just written among
  // them; those buckets start when the call returns.
  const bool report = weight_grad_progress_ != nullptr && !weight_grads_deferred_;
  auto done = [&](int64_t part) {
    if (report) weight_grad_progress_(static_cast<int>(part));
  };
  if (layout_.stage.has_head) {
    if (!head_grad_in_input_) FR_RETURN_IF_ERROR(HeadWteGrad(s));
    FR_RETURN_IF_ERROR(HeadNormBackwardWeight(s));
    done(0);
  }
  for (int64_t l = L - 1; l >= 0; --l) {
    FR_RETURN_IF_ERROR(llama() ? LlamaLayerBackwardWeight(s, l, LayerInput(s, l))
                               : LayerBackwardWeight(s, l, LayerInput(s, l)));
    done(L - l);
  }
  weight_grads_deferred_ = false;  // every layer's products have written theirs
  if (layout_.stage.has_embedding) {
    FR_KERNEL(kEmbedding, EncoderBackwardWeight, G(ParamTensor::kWte),
              llama() ? nullptr : G(ParamTensor::kWpe), Ptr<T>(s.dinput),
              Ptr<int32_t>(s.bucket_positions), Ptr<int32_t>(s.bucket_tokens),
              Ptr<int32_t>(s.bucket_starts), distinct_tokens_[slot], B_, T_, C, stream_);
    done(L + 1);
  }
  return absl::OkStatus();
}

// The members defined here, for both element types (the class itself is instantiated in
// cuda_stage_model.cc).
#define FR_INSTANTIATE(T)                                                                    \
  template const T* CudaStage<T>::LayerInput(const Slot&, int64_t) const;                    \
  template T* CudaStage<T>::OutputActivations(const Slot&) const;                            \
  template T* CudaStage<T>::OutputGrad(const Slot&) const;                                   \
  template T* CudaStage<T>::BlockOutputGrad(const Slot&, int64_t) const;                     \
  template T* CudaStage<T>::ActivationOutput(const Slot&, int64_t) const;                    \
  template absl::Status CudaStage<T>::AttentionScores(const Slot&, int64_t);                 \
  template absl::Status CudaStage<T>::AttentionForward(const Slot&, int64_t);                \
  template absl::Status CudaStage<T>::LayerForward(const Slot&, int64_t, const T*);          \
  template absl::Status CudaStage<T>::LaunchForward(int, double*);                           \
  template absl::Status CudaStage<T>::AttentionBackward(const Slot&, int64_t, const T*);     \
  template absl::Status CudaStage<T>::LayerBackwardInput(const Slot&, int64_t, const T*, T*, \
                                                         bool);                              \
  template T* CudaStage<T>::HeadMatrix() const;                                              \
  template absl::Status CudaStage<T>::HeadNormForward(const Slot&);                          \
  template absl::Status CudaStage<T>::HeadNormBackwardInput(const Slot&, T*);                \
  template absl::Status CudaStage<T>::HeadNormBackwardWeight(const Slot&);                   \
  template absl::Status CudaStage<T>::HeadWteGrad(const Slot&);                              \
  template absl::Status CudaStage<T>::BackwardInput(int, float);                             \
  template absl::Status CudaStage<T>::LayerBackwardWeight(const Slot&, int64_t, const T*);   \
  template absl::Status CudaStage<T>::BackwardWeight(int);
FR_INSTANTIATE(float)
FR_INSTANTIATE(bf16)
#undef FR_INSTANTIATE

}  // namespace freeride::cuda
