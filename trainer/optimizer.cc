#include "trainer/optimizer.h"

#include <cmath>

#include "models/cpu/optimizer.h"

namespace freeride {

double LearningRate(const OptimConfig& optim, int64_t step, int64_t total_steps) {
  if (step < optim.warmup_steps) {
    return optim.lr * static_cast<double>(step + 1) / static_cast<double>(optim.warmup_steps);
  }
  if (optim.schedule == "constant") return optim.lr;
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - 1 - optim.warmup_steps);
  const double progress =
      std::min(1.0, static_cast<double>(step - optim.warmup_steps) / decay_steps);
  const double min_lr = optim.lr * optim.min_lr_ratio;
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (optim.lr - min_lr);
}

std::vector<double> GradSquaresByUnit(GPT2Stage<float>& stage) {
  const ParamLayout& layout = stage.layout();
  const GPT2Config& cfg = stage.config();
  std::vector<double> units;
  auto squares = [&](ParamTensor t, int64_t offset, int64_t n) {
    return cpu::SumOfSquares(stage.grad(t) + offset, n);
  };
  if (stage.stage().has_embedding) {
    units.push_back(squares(ParamTensor::kWte, 0, layout.slot(ParamTensor::kWte).elements) +
                    squares(ParamTensor::kWpe, 0, layout.slot(ParamTensor::kWpe).elements));
  }
  for (int64_t l = 0; l < stage.stage().num_layers(); ++l) {
    double sum = 0;
    for (int i = 0; i < kNumParamTensors; ++i) {
      const ParamTensor t = static_cast<ParamTensor>(i);
      if (!IsPerLayer(t)) continue;
      const int64_t per = ParamElements(cfg, t);
      sum += squares(t, l * per, per);
    }
    units.push_back(sum);
  }
  if (stage.stage().has_head) {
    units.push_back(squares(ParamTensor::kLnfW, 0, cfg.n_embd) +
                    squares(ParamTensor::kLnfB, 0, cfg.n_embd));
  }
  return units;
}

double ClipScale(double grad_norm, double clip) {
  if (clip <= 0) return 1.0;
  return std::min(1.0, clip / (grad_norm + 1e-6));
}

void AdamW::Update(GPT2Stage<float>& stage, const OptimConfig& optim, double lr,
                   double grad_scale, int64_t step) {
  for (const TensorSlot& slot : stage.layout().slots) {
    if (!slot.present) continue;
    cpu::AdamWParams p;
    p.lr = static_cast<float>(lr);
    p.beta1 = static_cast<float>(optim.beta1);
    p.beta2 = static_cast<float>(optim.beta2);
    p.eps = static_cast<float>(optim.eps);
    p.weight_decay = IsDecayed(slot.tensor) ? static_cast<float>(optim.weight_decay) : 0.0f;
    p.step = step;
    p.grad_scale = static_cast<float>(grad_scale);
    cpu::AdamWUpdate(stage.params() + slot.offset, stage.grads() + slot.offset,
                     m_.data() + slot.offset, v_.data() + slot.offset, slot.elements, p);
  }
}

}  // namespace freeride
