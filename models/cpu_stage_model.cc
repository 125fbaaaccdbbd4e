#include "models/cpu_stage_model.h"

#include <cstring>

#include "core/status.h"
#include "models/cpu/optimizer.h"
#include "models/token_ids.h"

namespace freeride {

template <typename Stage>
int64_t BasicCpuStageModel<Stage>::ActivationFloats() const {
  return model_.micro_batch() * model_.seq_len() * model_.config().n_embd;
}

template <typename Stage>
absl::Status BasicCpuStageModel<Stage>::SetTokens(int slot, const int32_t* tokens) {
  FR_RETURN_IF_ERROR(
      CheckTokenIds(tokens, micro_batch() * seq_len(), model_.config().vocab_size, "tokens"));
  std::memcpy(model_.tokens(slot), tokens, micro_batch() * seq_len() * sizeof(int32_t));
  return absl::OkStatus();
}
template <typename Stage>
absl::Status BasicCpuStageModel<Stage>::SetTargets(int slot, const int32_t* targets) {
  FR_RETURN_IF_ERROR(
      CheckTokenIds(targets, micro_batch() * seq_len(), model_.config().vocab_size, "targets"));
  std::memcpy(model_.targets(slot), targets, micro_batch() * seq_len() * sizeof(int32_t));
  return absl::OkStatus();
}
template <typename Stage>
absl::Status BasicCpuStageModel<Stage>::SetInputActivations(int slot, const void* x) {
  std::memcpy(model_.input_activations(slot), x, ActivationFloats() * sizeof(float));
  return absl::OkStatus();
}
template <typename Stage>
absl::Status BasicCpuStageModel<Stage>::SetOutputGrad(int slot, const void* dy) {
  std::memcpy(model_.output_grad(slot), dy, ActivationFloats() * sizeof(float));
  return absl::OkStatus();
}
template <typename Stage>
absl::Status BasicCpuStageModel<Stage>::GetOutputActivations(int slot, void* y) {
  std::memcpy(y, model_.output_activations(slot), ActivationFloats() * sizeof(float));
  return absl::OkStatus();
}
template <typename Stage>
absl::Status BasicCpuStageModel<Stage>::GetInputGrad(int slot, void* dx) {
  std::memcpy(dx, model_.input_grad(slot), ActivationFloats() * sizeof(float));
  return absl::OkStatus();
}

template <typename Stage>
absl::Status BasicCpuStageModel<Stage>::GetLogitsAt(int slot, int64_t position, float* logits) {
  const int64_t Vp = model_.config().padded_vocab_size, T = model_.seq_len();
  for (int64_t b = 0; b < model_.micro_batch(); ++b) {
    std::memcpy(logits + b * Vp, model_.logits(slot) + (b * T + position) * Vp, Vp * sizeof(float));
  }
  return absl::OkStatus();
}

template <typename Stage>
absl::StatusOr<std::vector<double>> BasicCpuStageModel<Stage>::GradSquaresByUnit() {
  const ParamLayout& layout = model_.layout();
  const GPT2Config& cfg = model_.config();
  std::vector<double> units;
  // Σ g² of tensor `t`'s elements [offset, offset + n) of this stage (0 when absent).
  auto squares = [&](ParamTensor t, int64_t offset, int64_t n) {
    return layout.slot(t).present ? cpu::SumOfSquares(model_.grad(t) + offset, n) : 0.0;
  };
  auto whole = [&](ParamTensor t) { return squares(t, 0, layout.slot(t).elements); };
  if (stage().has_embedding) units.push_back(whole(ParamTensor::kWte) + whole(ParamTensor::kWpe));
  for (int64_t l = 0; l < stage().num_layers(); ++l) {
    double sum = 0;
    for (int i = 0; i < kNumParamTensors; ++i) {
      const ParamTensor t = static_cast<ParamTensor>(i);
      if (!IsPerLayer(t)) continue;
      const int64_t per = ParamElements(cfg, t);
      sum += squares(t, l * per, per);
    }
    units.push_back(sum);
  }
  if (stage().has_head) {
    // An untied head's matrix counts with the final norm (a tied one is the embedding's).
    units.push_back(whole(ParamTensor::kLnfW) + whole(ParamTensor::kLnfB) +
                    whole(ParamTensor::kLmHead));
  }
  return units;
}

template <typename Stage>
absl::Status BasicCpuStageModel<Stage>::ApplyAdamW(const AdamWStep& step) {
  for (const TensorSlot& slot : layout().slots) {
    if (!slot.present) continue;
    cpu::AdamWParams p;
    p.lr = static_cast<float>(step.lr);
    p.beta1 = static_cast<float>(step.beta1);
    p.beta2 = static_cast<float>(step.beta2);
    p.eps = static_cast<float>(step.eps);
    p.weight_decay = IsDecayed(slot.tensor) ? static_cast<float>(step.weight_decay) : 0.0f;
    p.step = step.step;
    p.grad_scale = static_cast<float>(step.grad_scale);
    cpu::AdamWUpdate(model_.params() + slot.offset, model_.grads() + slot.offset,
                     m_.data() + slot.offset, v_.data() + slot.offset, slot.elements, p);
  }
  return absl::OkStatus();
}

template <typename Stage>
absl::Status BasicCpuStageModel<Stage>::GetParams(float* dst) {
  std::memcpy(dst, model_.params(), num_params() * sizeof(float));
  return absl::OkStatus();
}
template <typename Stage>
absl::Status BasicCpuStageModel<Stage>::SetParams(const float* src) {
  std::memcpy(model_.params(), src, num_params() * sizeof(float));
  return absl::OkStatus();
}
template <typename Stage>
absl::Status BasicCpuStageModel<Stage>::GetOptimizerState(float* m, float* v) {
  std::memcpy(m, m_.data(), num_params() * sizeof(float));
  std::memcpy(v, v_.data(), num_params() * sizeof(float));
  return absl::OkStatus();
}
template <typename Stage>
absl::Status BasicCpuStageModel<Stage>::SetOptimizerState(const float* m, const float* v) {
  std::memcpy(m_.data(), m, num_params() * sizeof(float));
  std::memcpy(v_.data(), v, num_params() * sizeof(float));
  return absl::OkStatus();
}

template class BasicCpuStageModel<GPT2Stage<float>>;
template class BasicCpuStageModel<LlamaStage<float>>;

}  // namespace freeride
