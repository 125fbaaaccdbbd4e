// What the pipeline runtime and the trainer need from one model chunk, whatever device holds
// it: the CPU backend (CpuStageModel, around GPT2Stage<float>) and the CUDA backend
// (CudaStageModel) both implement it. Everything crossing this interface is fp32 in host
// memory — the messages between stages, the gradients summed across ranks, parameters and
// optimizer state for checkpoints — so transports and checkpoints never see device memory or
// a device's precision. Every call that can touch a device returns a Status: a CUDA error
// ends the step with the library's message instead of aborting the process.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/gpt2_config.h"

namespace freeride {

// One AdamW step's settings (weight decay applies only to IsDecayed tensors).
struct AdamWStep {
  double lr = 0;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0;
  int64_t step = 1;         // 1-based, for the bias corrections
  double grad_scale = 1;    // multiplies every gradient first (clipping)
};

class StageModel {
 public:
  virtual ~StageModel() = default;

  virtual const ParamLayout& layout() const = 0;
  const GPT2Config& config() const { return layout().config; }
  const StageSpec& stage() const { return layout().stage; }
  int64_t num_params() const { return layout().total; }
  virtual int64_t micro_batch() const = 0;
  virtual int64_t seq_len() const = 0;
  virtual int slots() const = 0;
  // Where it runs, for logs: "cpu fp32", "cuda:0 bf16".
  virtual std::string Describe() const = 0;
  // Device memory the chunk holds (0 on the CPU). Allocated when it is created and never inside
  // a step, so it is also the chunk's peak.
  virtual int64_t DeviceBytes() const { return 0; }

  // A slot's inputs: tokens [B·T] (embedding stage), targets [B·T] (head stage), activations
  // [B·T·C] from the previous stage (others); and the gradient [B·T·C] of its outputs from the
  // next stage (non-head stages).
  virtual absl::Status SetTokens(int slot, const int32_t* tokens) = 0;
  virtual absl::Status SetTargets(int slot, const int32_t* targets) = 0;
  virtual absl::Status SetInputActivations(int slot, const float* x) = 0;
  virtual absl::Status SetOutputGrad(int slot, const float* dy) = 0;
  // A slot's outputs: activations after Forward (non-head stages), the gradient of its input
  // activations after BackwardInput (non-embedding stages).
  virtual absl::Status GetOutputActivations(int slot, float* y) = 0;
  virtual absl::Status GetInputGrad(int slot, float* dx) = 0;

  // The logits [B × Vp] at sequence position `position` of each of the slot's B sequences,
  // after a Forward (head stage; BackwardInput overwrites them with their gradient).
  virtual absl::Status GetLogitsAt(int slot, int64_t position, float* logits) = 0;

  // GPT2Stage's contract: Forward returns the head's mean loss (else 0); BackwardInput then
  // BackwardWeight; FoldHeadWteGrad once per step after the last BackwardWeight.
  virtual absl::StatusOr<double> Forward(int slot) = 0;
  // Forward for a slot whose BackwardInput(slot, loss_scale) follows, with this same
  // `loss_scale`, before anything reads its logits: a head may then make the logits gradient in
  // the pass that makes the loss (CUDA's fused classifier), so GetLogitsAt has no logits to give
  // after it. The default is Forward.
  virtual absl::StatusOr<double> ForwardTraining(int slot, float /*loss_scale*/) {
    return Forward(slot);
  }
  virtual absl::Status BackwardInput(int slot, float loss_scale) = 0;
  virtual absl::Status BackwardWeight(int slot) = 0;
  virtual absl::Status ZeroGrads() = 0;
  virtual absl::Status FoldHeadWteGrad() = 0;
  // Makes the head's share of the tied wte gradient in BackwardInput rather than in
  // BackwardWeight, so that a post-validated pipeline can sum the tied gradient once the head's
  // last I is done. The same bits when the head's Is run in its Ws' micro-batch order.
  virtual void SetHeadGradInBackwardInput(bool in_input) = 0;
  // `progress(part)` is called inside BackwardWeight as soon as the call has written its
  // last contribution to a part of the weights: 0 the head's final LayerNorm, 1 + k the k-th
  // of the chunk's blocks counted from its last, num_layers() + 1 the position embedding (wte
  // is never reported: the tied sum still adds to it). A data-parallel bucket starts summing
  // from there (pipeline/grad_buckets.h). Null: not called. Backends whose writes land later
  // than the call returns (CUDA's stream) ignore it: their buckets start when the
  // instruction ends.
  virtual void SetWeightGradProgress(std::function<void(int part)> /*progress*/) {}

  // Gradient elements [offset, offset + n) of the stage's buffer in host memory, for a sum
  // across ranks; CommitHostGrads makes the (summed) host copy the gradient again.
  virtual absl::StatusOr<float*> HostGrads(int64_t offset, int64_t n) = 0;
  virtual absl::Status CommitHostGrads(int64_t offset, int64_t n) = 0;

  // Σ g² per model unit, in model order: the embedding (wte, wpe), each layer, the final
  // LayerNorm; a head-only stage leaves wte out (the first stage counts the tied matrix once).
  virtual absl::StatusOr<std::vector<double>> GradSquaresByUnit() = 0;
  virtual absl::Status ApplyAdamW(const AdamWStep& step) = 0;

  // fp32 parameters (the master copy) and AdamW moments, `num_params()` each, in the layout's
  // order: checkpoints and initialisation from a whole model.
  virtual absl::Status GetParams(float* dst) = 0;
  virtual absl::Status SetParams(const float* src) = 0;
  virtual absl::Status GetOptimizerState(float* m, float* v) = 0;
  virtual absl::Status SetOptimizerState(const float* m, const float* v) = 0;
  // GPT-2's initialisation, the same values on every backend (GPT2Stage::InitRandom).
  virtual absl::Status InitRandom(uint64_t seed) = 0;
};

}  // namespace freeride
