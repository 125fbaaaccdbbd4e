// One pipeline stage of GPT-2 on the CPU (the whole model is the one-stage case): its layers on
// DecoderStage (decoder_stage.h: parameters in llm.c's layout, the slots' inputs and outputs,
// the tied head, the contract of Forward → BackwardInput → BackwardWeight that every family
// keeps).
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
#pragma once

#include <cstdint>
#include <vector>

#include "core/host_memory.h"
#include "models/decoder_stage.h"
#include "models/gpt2_config.h"
#include "models/param_init.h"
#include "models/recompute.h"

namespace freeride {

// GPT-2's initialisation of a stage's parameters (param_init.h's, as GPT2Stage::InitRandom's):
// any backend that fills its parameters through this gets the CPU's values exactly.
template <typename T>
void InitGPT2Params(const ParamLayout& layout, uint64_t seed, T* params) {
  InitDecoderParams(layout, seed, params);
}

// The host buffers a GPT2Stage of these dimensions allocates (`element_bytes` per value),
// named and sized without allocating anything, so a run can be refused before it starts.
std::vector<HostBuffer> PlanGPT2StageMemory(const GPT2Config& config, const StageSpec& stage,
                                            int64_t micro_batch, int64_t seq_len, int slots,
                                            int64_t element_bytes,
                                            Recompute recompute = Recompute::kNone);

template <typename T>
class GPT2Stage : public DecoderStage<T> {
 public:
  // `micro_batch` sequences of `seq_len` tokens per slot; `slots` micro-batches in flight.
  GPT2Stage(const GPT2Config& config, const StageSpec& stage, int64_t micro_batch, int64_t seq_len,
            int slots, Recompute recompute = Recompute::kNone);
  ~GPT2Stage();

  using DecoderStage<T>::config;
  using DecoderStage<T>::stage;
  using DecoderStage<T>::slots;
  using DecoderStage<T>::param;
  using DecoderStage<T>::grad;

  Recompute recompute() const { return recompute_; }
  // Bytes of every buffer this stage allocated (what PlanGPT2StageMemory promises).
  int64_t HostBytes() const;
  // Bytes one slot holds (what each micro-batch in flight costs), and the recomputation's
  // scratch that all slots share.
  int64_t SlotBytes(int slot) const;
  int64_t RecomputeScratchBytes() const;

  // GPT-2's initialisation (param_init.h): N(0, 0.02), residual projections scaled by
  // 1/sqrt(2·n_layer), biases 0, LayerNorm weights 1, padded vocabulary rows 0.
  void InitRandom(uint64_t seed);

  // Outputs: activations [B·T·C] a non-head stage sends on after Forward; the gradient
  // [B·T·C] a non-head stage receives (write before BackwardInput).
  const T* output_activations(int slot) const;
  T* output_grad(int slot);

  // Runs the stage forward. On the head stage returns the micro-batch's mean loss, else 0.
  double Forward(int slot);
  // Gradients with respect to activations. `loss_scale` multiplies the head's per-token loss
  // gradient (1 / tokens in the whole optimizer step, for a mean over the step).
  void BackwardInput(int slot, T loss_scale);
  // Accumulates parameter gradients from what BackwardInput stashed.
  void BackwardWeight(int slot);

 private:
  struct Slot;
  using DecoderStage<T>::B_;
  using DecoderStage<T>::T_;
  using DecoderStage<T>::slots_;
  Slot& slot_at(int slot) const { return static_cast<Slot&>(*slots_[slot]); }
  // Where layer tensor `t` (gpt2.cc's LayerTensor) of local layer `l` lives for slot `s`: in
  // the slot where its mode keeps it, else in the shared scratch.
  T* Tensor(Slot& s, int t, int64_t l);
  void LayerForward(Slot& s, int64_t l, const T* x, T* out);
  void LayerBackwardInput(Slot& s, int64_t l, const T* x, T* dx);
  void LayerBackwardWeight(Slot& s, int64_t l, const T* x);
  // Full recomputation into the scratch: every block forward, and with `input_grads` their
  // input gradients too (what BackwardWeight reads).
  void RecomputeBlocks(Slot& s, bool input_grads);
  T* LayerInput(Slot& s, int64_t l);
  T* OutputGrad(Slot& s);

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
