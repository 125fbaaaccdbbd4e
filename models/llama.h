// One pipeline stage of a Llama-family decoder on the CPU (the whole model is the one-stage
// case): RMSNorm, rotary position embeddings on q and k, grouped-query attention, a SwiGLU MLP,
// no biases, the head tied to the token embedding or not. Parameters live in the tensor slots
// ParamLayout gives a Llama config (gpt2_config.h).
//
// Its layers on DecoderStage (decoder_stage.h), as GPT2Stage's are, so CpuStageModel drives
// either: the slots' inputs and outputs, the head tied or not, and the contract of Forward →
// BackwardInput → BackwardWeight are that base's.
#pragma once

#include <cstdint>
#include <vector>

#include "core/host_memory.h"
#include "models/decoder_stage.h"
#include "models/gpt2_config.h"
#include "models/param_init.h"

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
                                             int64_t element_bytes);

template <typename T>
class LlamaStage : public DecoderStage<T> {
 public:
  LlamaStage(const GPT2Config& config, const StageSpec& stage, int64_t micro_batch, int64_t seq_len,
             int slots);
  ~LlamaStage();

  using DecoderStage<T>::config;
  using DecoderStage<T>::stage;
  using DecoderStage<T>::param;
  using DecoderStage<T>::grad;

  int64_t HostBytes() const;
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
  void LayerForward(Slot& s, int64_t l, const T* x);
  void LayerBackwardInput(Slot& s, int64_t l, const T* x, T* dx);
  void LayerBackwardWeight(Slot& s, int64_t l, const T* x);
  const T* LayerInput(const Slot& s, int64_t l) const;

  std::vector<T> rope_cos_, rope_sin_;
  // Scratch shared by all slots (only one slot computes at a time).
  std::vector<T> scratch_f_, scratch_c_;
};

extern template class LlamaStage<float>;
extern template class LlamaStage<double>;

}  // namespace freeride
