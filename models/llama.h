// One pipeline stage of a Llama-family decoder on the CPU (the whole model is the one-stage
// case): RMSNorm, rotary position embeddings on q and k, grouped-query attention, a SwiGLU MLP,
// no biases, the head tied to the token embedding or not. Parameters live in the tensor slots
// ParamLayout gives a Llama config (gpt2_config.h).
//
// The same contract as GPT2Stage (gpt2.h), so CpuStageModel drives either: a micro-batch's
// slot goes Forward → BackwardInput → BackwardWeight, BackwardInput stashes what the weight
// gradients need, and a tied head's share of the wte gradient waits in its own buffer for
// FoldHeadWteGrad (an untied head's gradient goes straight to kLmHead).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/host_memory.h"
#include "models/gpt2_config.h"

namespace freeride {

// The Llama initialisation of a stage's parameters, seeded per (tensor, layer) as GPT-2's is so
// that any stage initialises exactly its slice of the whole model: matrices N(0, 0.02), the
// residual projections (attprojw, fcprojw) scaled by 1/sqrt(2·n_layer), RMSNorm weights 1,
// padded vocabulary rows 0.
template <typename T>
void InitLlamaParams(const ParamLayout& layout, uint64_t seed, T* params);

// The host buffers a LlamaStage of these dimensions allocates (`element_bytes` per value).
std::vector<HostBuffer> PlanLlamaStageMemory(const GPT2Config& config, const StageSpec& stage,
                                             int64_t micro_batch, int64_t seq_len, int slots,
                                             int64_t element_bytes);

template <typename T>
class LlamaStage {
 public:
  LlamaStage(const GPT2Config& config, const StageSpec& stage, int64_t micro_batch, int64_t seq_len,
             int slots);
  ~LlamaStage();
  LlamaStage(const LlamaStage&) = delete;
  LlamaStage& operator=(const LlamaStage&) = delete;

  const GPT2Config& config() const { return layout_.config; }
  const StageSpec& stage() const { return layout_.stage; }
  const ParamLayout& layout() const { return layout_; }
  int64_t micro_batch() const { return B_; }
  int64_t seq_len() const { return T_; }
  int slots() const { return static_cast<int>(slots_.size()); }
  int64_t HostBytes() const;

  T* params() { return params_.data(); }
  const T* params() const { return params_.data(); }
  T* grads() { return grads_.data(); }
  const T* grads() const { return grads_.data(); }
  int64_t num_params() const { return layout_.total; }
  T* param(ParamTensor t) { return params_.data() + layout_.slot(t).offset; }
  T* grad(ParamTensor t) { return grads_.data() + layout_.slot(t).offset; }

  void InitRandom(uint64_t seed);
  void ZeroGrads();

  int32_t* tokens(int slot);
  int32_t* targets(int slot);
  T* input_activations(int slot);
  const T* output_activations(int slot) const;
  T* output_grad(int slot);
  const T* input_grad(int slot) const;

  double Forward(int slot);
  void BackwardInput(int slot, T loss_scale);
  void BackwardWeight(int slot);
  void set_head_grad_in_backward_input(bool in_input) { head_grad_in_input_ = in_input; }
  void set_weight_grad_progress(std::function<void(int part)> progress) {
    weight_grad_progress_ = std::move(progress);
  }

  const T* losses(int slot) const;
  const T* logits(int slot) const;
  void FoldHeadWteGrad();

 private:
  struct Slot;
  void LayerForward(Slot& s, int64_t l, const T* x);
  void LayerBackwardInput(Slot& s, int64_t l, const T* x, T* dx);
  void LayerBackwardWeight(Slot& s, int64_t l, const T* x);
  void HeadGrad(const Slot& s);  // the head matrix's gradient += dlogitsᵀ · lnf
  const T* LayerInput(const Slot& s, int64_t l) const;
  bool tied() const { return TiedElements(config()) > 0; }
  T* head_weight() { return param(tied() ? ParamTensor::kWte : ParamTensor::kLmHead); }

  ParamLayout layout_;
  int64_t B_, T_;
  std::vector<T> params_, grads_, head_wte_grad_;
  std::vector<T> rope_cos_, rope_sin_;
  bool head_grad_in_input_ = false;
  std::function<void(int part)> weight_grad_progress_;
  std::vector<std::unique_ptr<Slot>> slots_;
  // Scratch shared by all slots (only one slot computes at a time).
  std::vector<T> scratch_f_, scratch_c_;
};

extern template class LlamaStage<float>;
extern template class LlamaStage<double>;

}  // namespace freeride
