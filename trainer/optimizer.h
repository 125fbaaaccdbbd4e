// The optimizer step around the model: learning-rate schedule, global gradient norm (in a
// summation order that does not depend on how the model is split into stages), AdamW state.
#pragma once

#include <cstdint>
#include <vector>

#include "models/gpt2.h"
#include "trainer/config.h"

namespace freeride {

// Learning rate at 0-based `step` of `total_steps`: linear warm-up to optim.lr over
// warmup_steps, then cosine decay to lr·min_lr_ratio at the last step, or constant.
double LearningRate(const OptimConfig& optim, int64_t step, int64_t total_steps);

// Σ g² of a stage's gradients per model unit, in model order: the embedding (wte, wpe), each
// layer, the final LayerNorm. A head-only stage leaves wte out (the first stage counts the
// tied matrix once). Summing every stage's units in stage order gives the same bits as the
// whole model on one stage.
std::vector<double> GradSquaresByUnit(GPT2Stage<float>& stage);

// PyTorch's clip_grad_norm_ coefficient: min(1, clip / (norm + 1e-6)); 1 when clip is 0.
double ClipScale(double grad_norm, double clip);

class AdamW {
 public:
  explicit AdamW(int64_t num_params) : m_(num_params, 0.0f), v_(num_params, 0.0f) {}
  // One update of every tensor of `stage` at 1-based `step`, gradients scaled by grad_scale.
  // Weight decay only on matrices (nanoGPT's and llm.c's rule).
  void Update(GPT2Stage<float>& stage, const OptimConfig& optim, double lr, double grad_scale,
              int64_t step);
  std::vector<float>& m() { return m_; }
  std::vector<float>& v() { return v_; }

 private:
  std::vector<float> m_, v_;
};

}  // namespace freeride
