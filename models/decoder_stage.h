// What every decoder family's CPU stage shares (GPT2Stage in gpt2.h, LlamaStage in llama.h), so
// that a family writes only its layers: the parameters and gradients in ParamLayout's slots,
// the micro-batch slots' inputs and outputs, the head (logits, cross-entropy, the head matrix's
// gradient, tied to the token embedding or not) and the tied gradient's fold, and the
// zero-bubble split's two switches (where the head's gradient goes, the weight-gradient
// progress).
//
// The contract a family's stage keeps (CpuStageModel drives either through it): a micro-batch's
// slot goes Forward → BackwardInput → BackwardWeight; BackwardInput stashes every output
// gradient the weight gradients need, so BackwardWeight can run later (zero-bubble schedules)
// and gives the same bits as running both at once. A tied head's share of the wte gradient
// accumulates in its own buffer and is added to the embedding's share by FoldHeadWteGrad (one
// stage) or by the pipeline's tied all-reduce: either way emb + head, bit for bit. An untied
// head's gradient goes straight to kLmHead.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "models/gpt2_config.h"

namespace freeride {

// `v` as `n` value-initialised elements: how the stages size their buffers.
template <typename V>
void AssignZeros(V& v, int64_t n) {
  v.assign(static_cast<size_t>(n), typename V::value_type{});
}

// The buffers of a micro-batch's slot that every family has; a family's slot adds its layers'.
template <typename T>
struct DecoderSlot {
  virtual ~DecoderSlot() = default;
  std::vector<int32_t> tokens, targets;  // [BT]: on the embedding stage, on the head stage
  // [BTC]: the embedding's output or the previous stage's activations, and their gradient.
  std::vector<T> input, dinput;
  // The head's: the final norm's output, its 1/rms (or 1/std), logits [BT·Vp], the loss's
  // log-sum-exp and per-token losses, and the gradients of the norm's output and the logits.
  std::vector<T> lnf, lnf_rstd, logits, logsumexp, losses, dlnf, dlogits;
};

template <typename T>
class DecoderStage {
 public:
  DecoderStage(const DecoderStage&) = delete;
  DecoderStage& operator=(const DecoderStage&) = delete;

  const GPT2Config& config() const { return layout_.config; }
  const StageSpec& stage() const { return layout_.stage; }
  const ParamLayout& layout() const { return layout_; }
  int64_t micro_batch() const { return B_; }
  int64_t seq_len() const { return T_; }
  int slots() const { return static_cast<int>(slots_.size()); }

  T* params() { return params_.data(); }
  const T* params() const { return params_.data(); }
  T* grads() { return grads_.data(); }
  const T* grads() const { return grads_.data(); }
  int64_t num_params() const { return layout_.total; }
  // Start of tensor `t` (for per-layer tensors: of this stage's first layer).
  T* param(ParamTensor t) { return params_.data() + layout_.slot(t).offset; }
  T* grad(ParamTensor t) { return grads_.data() + layout_.slot(t).offset; }
  // The head's share of the tied wte gradient (empty without a head or with an untied one).
  T* head_wte_grad() { return head_wte_grad_.data(); }

  void ZeroGrads();

  // Inputs of a slot: tokens [B·T] for the embedding stage, targets [B·T] for the head stage,
  // activations [B·T·C] for any other stage (write them before Forward).
  int32_t* tokens(int slot) { return slots_[slot]->tokens.data(); }
  int32_t* targets(int slot) { return slots_[slot]->targets.data(); }
  T* input_activations(int slot) { return slots_[slot]->input.data(); }
  // The gradient of this stage's input activations a non-embedding stage sends back after
  // BackwardInput.
  const T* input_grad(int slot) const { return slots_[slot]->dinput.data(); }
  // Per-token losses and logits [B·T·Vp] of the slot's last Forward (head stage).
  const T* losses(int slot) const { return slots_[slot]->losses.data(); }
  const T* logits(int slot) const { return slots_[slot]->logits.data(); }

  // The head's share of the wte gradient accumulates in BackwardInput instead of
  // BackwardWeight (StageModel::SetHeadGradInBackwardInput).
  void set_head_grad_in_backward_input(bool in_input) { head_grad_in_input_ = in_input; }
  // Called in BackwardWeight as each part of the weights is done (StageModel's numbering: 0 the
  // head, 1 + i the stage's i-th layer from the last, L + 1 the embedding).
  void set_weight_grad_progress(std::function<void(int part)> progress) {
    weight_grad_progress_ = std::move(progress);
  }

  // Moves a tied head's wte gradient into grad(kWte): added to the embedding's share on a stage
  // holding both, copied on a head-only stage (whose wte gradient the pipeline then
  // all-reduces with the first stage's). Call once per step, after the last BackwardWeight.
  void FoldHeadWteGrad();

 protected:
  DecoderStage(const GPT2Config& config, const StageSpec& stage, int64_t micro_batch,
               int64_t seq_len);
  ~DecoderStage();

  // Sizes the shared buffers of a family's new slot and adds it (slot ids count from 0).
  void AddSlot(std::unique_ptr<DecoderSlot<T>> slot);
  // Bytes of the parameters, their gradients and the head's wte gradient; of a slot's
  // DecoderSlot buffers.
  int64_t ParamBytes() const;
  static int64_t SlotIoBytes(const DecoderSlot<T>& s);

  bool tied() const { return TiedElements(config()) > 0; }
  T* head_weight() { return param(tied() ? ParamTensor::kWte : ParamTensor::kLmHead); }
  // Logits = lnf · headᵀ and the cross-entropy of the slot's targets; the mean loss.
  double HeadForward(DecoderSlot<T>& s);
  // The cross-entropy's gradient (scaled by `loss_scale`) back to dlnf, and the head matrix's
  // gradient when it goes in the input pass; zeroes the stage's output gradient `dout` [BTC],
  // into which the family's final norm then adds its input gradient.
  void HeadBackwardInput(DecoderSlot<T>& s, T loss_scale, T* dout);
  // The head matrix's gradient when it goes in the weight pass.
  void HeadBackwardWeight(const DecoderSlot<T>& s);
  void WeightGradDone(int64_t part) const;

  ParamLayout layout_;
  int64_t B_, T_;
  std::vector<T> params_, grads_;
  std::vector<std::unique_ptr<DecoderSlot<T>>> slots_;

 private:
  void HeadGrad(const DecoderSlot<T>& s);  // the head matrix's gradient += dlogitsᵀ · lnf

  std::vector<T> head_wte_grad_;
  bool head_grad_in_input_ = false;
  std::function<void(int part)> weight_grad_progress_;
};

extern template class DecoderStage<float>;
extern template class DecoderStage<double>;

}  // namespace freeride
