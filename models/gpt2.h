// One pipeline stage of GPT-2 on the CPU (the whole model is the one-stage case): its
// parameters and gradients in llm.c's layout, and activation slots for micro-batches in flight.
//
// A micro-batch's life in a slot: Forward → BackwardInput → BackwardWeight. BackwardInput
// stashes every output gradient the weight gradients need, so BackwardWeight can run later
// (zero-bubble schedules) and produces the same bits as running both at once.
//
// With recomputation (models/recompute.h) a slot holds only what its mode keeps; what is
// recomputed lives in scratch shared by all slots (one computes at a time):
//   selective  one block's attention probabilities, recomputed per block before its input
//              gradient; the GELU output is recomputed into the 4·C scratch before each
//              block's weight gradient (W reads it; nothing of it is kept).
//   full       every block's activations and stashed output gradients for one micro-batch:
//              BackwardInput recomputes the stage's forward there, and BackwardWeight reads
//              them. What W needs is then the slot's block inputs and the gradient at the
//              stage's output (kept per slot): a BackwardWeight that does not directly follow
//              its slot's BackwardInput (a zero-bubble W deferred past another slot's work)
//              recomputes the forward and the input gradients from them first, the same bits.
//
// The head's share of the tied token-embedding gradient accumulates in its own buffer and is
// added to the embedding's share by FoldHeadWteGrad (one stage) or by the pipeline's tied
// all-reduce: either way the result is emb + head, bit for bit.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/host_memory.h"
#include "models/gpt2_config.h"
#include "models/recompute.h"

namespace freeride {

// GPT-2's initialisation of a stage's parameters (see GPT2Stage::InitRandom): any backend that
// fills its parameters through this gets the CPU's values exactly.
template <typename T>
void InitGPT2Params(const ParamLayout& layout, uint64_t seed, T* params);

// The host buffers a GPT2Stage of these dimensions allocates (`element_bytes` per value),
// named and sized without allocating anything, so a run can be refused before it starts.
std::vector<HostBuffer> PlanGPT2StageMemory(const GPT2Config& config, const StageSpec& stage,
                                            int64_t micro_batch, int64_t seq_len, int slots,
                                            int64_t element_bytes,
                                            Recompute recompute = Recompute::kNone);

template <typename T>
class GPT2Stage {
 public:
  // `micro_batch` sequences of `seq_len` tokens per slot; `slots` micro-batches in flight.
  GPT2Stage(const GPT2Config& config, const StageSpec& stage, int64_t micro_batch, int64_t seq_len,
            int slots, Recompute recompute = Recompute::kNone);
  ~GPT2Stage();
  GPT2Stage(const GPT2Stage&) = delete;
  GPT2Stage& operator=(const GPT2Stage&) = delete;

  const GPT2Config& config() const { return layout_.config; }
  const StageSpec& stage() const { return layout_.stage; }
  const ParamLayout& layout() const { return layout_; }
  int64_t micro_batch() const { return B_; }
  int64_t seq_len() const { return T_; }
  int slots() const;
  Recompute recompute() const { return recompute_; }
  // Bytes of every buffer this stage allocated (what PlanGPT2StageMemory promises).
  int64_t HostBytes() const;
  // Bytes one slot holds (what each micro-batch in flight costs), and the recomputation's
  // scratch that all slots share.
  int64_t SlotBytes(int slot) const;
  int64_t RecomputeScratchBytes() const;

  T* params() { return params_.data(); }
  const T* params() const { return params_.data(); }
  T* grads() { return grads_.data(); }
  const T* grads() const { return grads_.data(); }
  int64_t num_params() const { return layout_.total; }
  // Start of tensor `t` (for per-layer tensors: of this stage's first layer).
  T* param(ParamTensor t) { return params_.data() + layout_.slot(t).offset; }
  T* grad(ParamTensor t) { return grads_.data() + layout_.slot(t).offset; }
  // The head's share of the wte gradient (empty without a head).
  T* head_wte_grad() { return head_wte_grad_.data(); }

  // GPT-2's initialisation, seeded per (tensor, layer) so any stage initialises exactly its
  // slice of the whole model: N(0, 0.02), residual projections scaled by 1/sqrt(2·n_layer),
  // biases 0, LayerNorm weights 1, padded vocabulary rows 0.
  void InitRandom(uint64_t seed);
  void ZeroGrads();

  // Inputs of a slot: tokens [B·T] for the embedding stage, targets [B·T] for the head stage,
  // activations [B·T·C] for any other stage (write them before Forward).
  int32_t* tokens(int slot);
  int32_t* targets(int slot);
  T* input_activations(int slot);
  // Outputs: activations [B·T·C] a non-head stage sends on after Forward; the gradient
  // [B·T·C] a non-head stage receives (write before BackwardInput); the gradient of this
  // stage's input activations a non-embedding stage sends back after BackwardInput.
  const T* output_activations(int slot) const;
  T* output_grad(int slot);
  const T* input_grad(int slot) const;

  // Runs the stage forward. On the head stage returns the micro-batch's mean loss, else 0.
  double Forward(int slot);
  // Gradients with respect to activations. `loss_scale` multiplies the head's per-token loss
  // gradient (1 / tokens in the whole optimizer step, for a mean over the step).
  void BackwardInput(int slot, T loss_scale);
  // Accumulates parameter gradients from what BackwardInput stashed.
  void BackwardWeight(int slot);
  // The head's share of the wte gradient accumulates in BackwardInput instead of
  // BackwardWeight (StageModel::SetHeadGradInBackwardInput).
  void set_head_grad_in_backward_input(bool in_input) { head_grad_in_input_ = in_input; }
  // Called in BackwardWeight as each part of the weights is done (StageModel's numbering).
  void set_weight_grad_progress(std::function<void(int part)> progress) {
    weight_grad_progress_ = std::move(progress);
  }

  // Per-token losses of the slot's last Forward (head stage).
  const T* losses(int slot) const;
  // Logits [B·T·Vp] of the slot's last Forward (head stage).
  const T* logits(int slot) const;

  // Moves the head's wte gradient into grad(kWte): added to the embedding's share on a stage
  // holding both, copied on a head-only stage (whose wte gradient the pipeline then
  // all-reduces with the first stage's). Call once per step, after the last BackwardWeight.
  void FoldHeadWteGrad();

 private:
  struct Slot;
  // Where layer tensor `t` (gpt2.cc's LayerTensor) of local layer `l` lives for slot `s`: in
  // the slot where its mode keeps it, else in the shared scratch.
  T* Tensor(Slot& s, int t, int64_t l);
  void LayerForward(Slot& s, int64_t l, const T* x, T* out);
  void LayerBackwardInput(Slot& s, int64_t l, const T* x, T* dx);
  void LayerBackwardWeight(Slot& s, int64_t l, const T* x);
  // Full recomputation into the scratch: every block forward, and with `input_grads` their
  // input gradients too (what BackwardWeight reads).
  void RecomputeBlocks(Slot& s, bool input_grads);
  void HeadWteGrad(const Slot& s);  // head_wte_grad_ += the slot's dlogits^T · lnf
  T* LayerInput(Slot& s, int64_t l);
  T* OutputGrad(Slot& s);

  ParamLayout layout_;
  int64_t B_, T_;
  std::vector<T> params_, grads_, head_wte_grad_;
  bool head_grad_in_input_ = false;
  std::function<void(int part)> weight_grad_progress_;
  std::vector<std::unique_ptr<Slot>> slots_;
  // Scratch shared by all slots (only one slot computes at a time).
  std::vector<T> scratch_4c_, scratch_c_;
  Recompute recompute_;
  // What recomputation writes, per layer tensor (empty for the ones slots keep).
  std::vector<std::vector<T>> recomputed_;
  // Full: the slot whose recomputed activations and input gradients the scratch holds (those
  // its BackwardWeight reads), or -1.
  int scratch_slot_ = -1;
};

extern template class GPT2Stage<float>;
extern template class GPT2Stage<double>;

}  // namespace freeride
