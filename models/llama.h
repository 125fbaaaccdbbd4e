// One pipeline stage of a Llama-family decoder on the CPU (the whole model is the one-stage
// case): RMSNorm, rotary position embeddings on q and k, grouped-query attention, a SwiGLU MLP,
// no biases, the head tied to the token embedding or not. Parameters live in the tensor slots
// ParamLayout gives a Llama config (gpt2_config.h).
//
// Its layers on DecoderStage (decoder_stage.h), as GPT2Stage's are, so CpuStageModel drives
// either: the slots' inputs and outputs, the head tied or not, and the contract of Forward →
// BackwardInput → BackwardWeight are that base's.
//
// With recomputation (models/recompute.h, as GPT2Stage's) a slot holds only what its mode
// keeps; what is recomputed lives in scratch shared by all slots (one computes at a time):
//   selective  one block's attention probabilities, recomputed per block from the kept q and k
//              (rotated) and v before its input gradient; the SwiGLU output is remade from its
//              kept input into the F-wide scratch before each block's weight gradient (W reads
//              it; nothing of it is kept).
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

// The Llama initialisation of a stage's parameters (param_init.h's, GPT-2's rule): matrices
// N(0, 0.02), the residual projections (attprojw, fcprojw) scaled by 1/sqrt(2·n_layer), RMSNorm
// weights 1, padded vocabulary rows 0 (an untied kLmHead's too).
template <typename T>
void InitLlamaParams(const ParamLayout& layout, uint64_t seed, T* params) {
  InitDecoderParams(layout, seed, params);
}

// The host buffers a LlamaStage of these dimensions allocates (`element_bytes` per value).
std::vector<HostBuffer> PlanLlamaStageMemory(const GPT2Config& config, const StageSpec& stage,
                                             int64_t micro_batch, int64_t seq_len, int slots,
                                             int64_t element_bytes,
                                             Recompute recompute = Recompute::kNone);

template <typename T>
class LlamaStage : public DecoderStage<T> {
 public:
  LlamaStage(const GPT2Config& config, const StageSpec& stage, int64_t micro_batch, int64_t seq_len,
             int slots, Recompute recompute = Recompute::kNone);
  ~LlamaStage();

  using DecoderStage<T>::config;
  using DecoderStage<T>::stage;
  using DecoderStage<T>::slots;
  using DecoderStage<T>::param;
  using DecoderStage<T>::grad;

  Recompute recompute() const { return recompute_; }
  // Bytes of every buffer this stage allocated (what PlanLlamaStageMemory promises).
  int64_t HostBytes() const;
  // Bytes one slot holds (what each micro-batch in flight costs), and the recomputation's
  // scratch that all slots share.
  int64_t SlotBytes(int slot) const;
  int64_t RecomputeScratchBytes() const;
  void InitRandom(uint64_t seed);

  const T* output_activations(int slot) const;
  T* output_grad(int slot);

  double Forward(int slot);
  void BackwardInput(int slot, T loss_scale);
  void BackwardWeight(int slot);

 private:
  struct Slot;
  using DecoderStage<T>::B_;
  using DecoderStage<T>::T_;
  using DecoderStage<T>::slots_;
  Slot& slot_at(int slot) const { return static_cast<Slot&>(*slots_[slot]); }
  // Where layer tensor `t` (llama.cc's LayerTensor) of local layer `l` lives for slot `s`: in
  // the slot where its mode keeps it, else in the shared scratch.
  T* Tensor(Slot& s, int t, int64_t l);
  void LayerForward(Slot& s, int64_t l, const T* x, T* out);
  void LayerBackwardInput(Slot& s, int64_t l, const T* x, T* dx);
  void LayerBackwardWeight(Slot& s, int64_t l, const T* x);
  // Full recomputation into the scratch: every block forward, and with `input_grads` their
  // input gradients too (what BackwardWeight reads).
  void RecomputeBlocks(Slot& s, bool input_grads);
  T* LayerInput(Slot& s, int64_t l);

  std::vector<T> rope_cos_, rope_sin_;
  // Scratch shared by all slots (only one slot computes at a time).
  std::vector<T> scratch_f_, scratch_c_;
  Recompute recompute_;
  // What recomputation writes, per layer tensor (empty for the ones slots keep).
  std::vector<std::vector<T>> recomputed_;
  // Full: the slot whose recomputed activations and input gradients the scratch holds (those
  // its BackwardWeight reads), or -1.
  int scratch_slot_ = -1;
};

extern template class LlamaStage<float>;
extern template class LlamaStage<double>;

}  // namespace freeride
