// The CPU backend behind the StageModel interface: a model family's stage (GPT2Stage<float> or
// LlamaStage<float>, which share one contract) and its AdamW moments.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "models/gpt2.h"
#include "models/llama.h"
#include "models/stage_model.h"

namespace freeride {

template <typename Stage>
class BasicCpuStageModel final : public StageModel {
 public:
  // `stage_args`: what the family's stage takes beyond its shape (its Recompute).
  template <typename... StageArgs>
  BasicCpuStageModel(const GPT2Config& config, const StageSpec& stage, int64_t micro_batch,
                     int64_t seq_len, int slots, StageArgs... stage_args)
      : model_(config, stage, micro_batch, seq_len, slots, stage_args...) {}

  Stage& model() { return model_; }

  const ParamLayout& layout() const override { return model_.layout(); }
  int64_t micro_batch() const override { return model_.micro_batch(); }
  int64_t seq_len() const override { return model_.seq_len(); }
  int slots() const override { return model_.slots(); }
  std::string Describe() const override { return "cpu fp32"; }

  absl::Status SetTokens(int slot, const int32_t* tokens) override;
  absl::Status SetTargets(int slot, const int32_t* targets) override;
  absl::Status SetInputActivations(int slot, const void* x) override;
  absl::Status SetOutputGrad(int slot, const void* dy) override;
  absl::Status GetOutputActivations(int slot, void* y) override;
  absl::Status GetInputGrad(int slot, void* dx) override;
  absl::Status GetLogitsAt(int slot, int64_t position, float* logits) override;

  absl::StatusOr<double> Forward(int slot) override { return model_.Forward(slot); }
  absl::Status ForwardKeepingLoss(int slot, std::optional<float> /*backward_loss_scale*/) override {
    kept_loss_ += model_.Forward(slot);
    return absl::OkStatus();
  }
  absl::StatusOr<double> TakeLosses() override { return std::exchange(kept_loss_, 0.0); }
  absl::Status Drain() override { return absl::OkStatus(); }
  absl::Status BackwardInput(int slot, float loss_scale) override {
    model_.BackwardInput(slot, loss_scale);
    return absl::OkStatus();
  }
  absl::Status BackwardWeight(int slot) override {
    model_.BackwardWeight(slot);
    return absl::OkStatus();
  }
  absl::Status ZeroGrads() override {
    model_.ZeroGrads();
    return absl::OkStatus();
  }
  absl::Status FoldHeadWteGrad() override {
    model_.FoldHeadWteGrad();
    return absl::OkStatus();
  }
  void SetHeadGradInBackwardInput(bool in_input) override {
    model_.set_head_grad_in_backward_input(in_input);
  }
  void SetWeightGradProgress(std::function<void(int part)> progress) override {
    model_.set_weight_grad_progress(std::move(progress));
  }

  absl::StatusOr<float*> HostGrads(int64_t offset, int64_t) override {
    return model_.grads() + offset;
  }
  absl::Status CommitHostGrads(int64_t, int64_t) override { return absl::OkStatus(); }

  absl::StatusOr<std::vector<double>> GradSquaresByUnit() override;
  absl::Status ApplyAdamW(const AdamWStep& step) override;

  absl::Status GetParams(float* dst) override;
  absl::Status SetParams(const float* src) override;
  absl::Status GetOptimizerState(float* m, float* v) override;
  absl::Status SetOptimizerState(const float* m, const float* v) override;
  absl::Status ShardOptimizerState(std::vector<ParamRange> ranges) override;
  int64_t OptimizerStateElements() const override {
    return sharded_ ? static_cast<int64_t>(m_.size()) : num_params();
  }
  // What the moments take now (none before they are first needed).
  int64_t OptimizerStateBytes() const override {
    return static_cast<int64_t>((m_.capacity() + v_.capacity()) * sizeof(float));
  }
  absl::Status ShardGradSquares(const std::vector<ParamRange>& ranges, double* partials) override;
  absl::StatusOr<float*> HostParams(int64_t offset, int64_t) override {
    return model_.params() + offset;
  }
  absl::Status InitRandom(uint64_t seed) override {
    model_.InitRandom(seed);
    return absl::OkStatus();
  }

 private:
  int64_t ActivationFloats() const;
  Stage model_;
  // The moments: of every parameter, or (ZeRO-1) of `shard_`'s ranges packed in order. Made
  // when first needed (zeros), so that a chunk sharded before its first step never holds the
  // whole moments (they would stay in the process's peak memory).
  void EnsureMoments() {
    if (sharded_ || !m_.empty()) return;
    m_.assign(num_params(), 0.0f);
    v_.assign(num_params(), 0.0f);
  }
  std::vector<float> m_, v_;
  std::vector<ParamRange> shard_;
  bool sharded_ = false;
  double kept_loss_ = 0;  // ForwardKeepingLoss's sum since TakeLosses
};

using CpuStageModel = BasicCpuStageModel<GPT2Stage<float>>;
using CpuLlamaStageModel = BasicCpuStageModel<LlamaStage<float>>;
extern template class BasicCpuStageModel<GPT2Stage<float>>;
extern template class BasicCpuStageModel<LlamaStage<float>>;

}  // namespace freeride
