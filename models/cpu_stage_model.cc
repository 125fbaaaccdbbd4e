#include "models/cpu_stage_model.h"

#include <algorithm>
#include <cstring>
#include <iterator>

#include "absl/strings/str_format.h"
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
  const NormPlan plan = PlanGradNorm(model_.layout());
  std::vector<double> partials(plan.chunks, 0.0);
  for (const NormSlice& slice : plan.slices) {
    cpu::ChunkSquares(model_.grads() + slice.offset, slice.n, partials.data() + slice.first_chunk);
  }
  return UnitsFromChunkSquares(plan, partials.data());
}

template <typename Stage>
absl::Status BasicCpuStageModel<Stage>::ShardGradSquares(const std::vector<ParamRange>& ranges,
                                                         double* partials) {
  // The ranges merged where they touch (a tensor cut between two buckets), ascending.
  std::vector<ParamRange> merged = ranges;
  std::sort(merged.begin(), merged.end(),
            [](const ParamRange& a, const ParamRange& b) { return a.offset < b.offset; });
  std::vector<ParamRange> held;
  for (const ParamRange& r : merged) {
    if (!held.empty() && held.back().offset + held.back().n == r.offset) {
      held.back().n += r.n;
    } else if (r.n > 0) {
      held.push_back(r);
    }
  }
  const NormPlan plan = PlanGradNorm(model_.layout());
  for (const NormSlice& slice : plan.slices) {
    for (int64_t c = 0; c < NormChunks(slice.n); ++c) {
      const int64_t lo = slice.offset + c * kNormChunk;
      const int64_t n = std::min(kNormChunk, slice.offset + slice.n - lo);
      // The last held range starting at or before the chunk.
      auto it = std::upper_bound(held.begin(), held.end(), lo,
                                 [](int64_t at, const ParamRange& r) { return at < r.offset; });
      if (it == held.begin()) continue;
      const ParamRange& r = *std::prev(it);
      if (lo >= r.offset + r.n) continue;
      if (lo + n > r.offset + r.n) {
        return absl::InternalError(absl::StrFormat(
            "a ZeRO-1 share ends inside a gradient-norm chunk ([%d, %d) of %s): the shares must "
            "keep every chunk whole",
            lo, lo + n, ParamTensorName(slice.tensor)));
      }
      cpu::ChunkSquares(model_.grads() + lo, n, partials + slice.first_chunk + c);
    }
  }
  return absl::OkStatus();
}

template <typename Stage>
absl::Status BasicCpuStageModel<Stage>::ApplyAdamW(const AdamWStep& step) {
  cpu::AdamWParams p;
  p.lr = static_cast<float>(step.lr);
  p.beta1 = static_cast<float>(step.beta1);
  p.beta2 = static_cast<float>(step.beta2);
  p.eps = static_cast<float>(step.eps);
  p.step = step.step;
  p.grad_scale = static_cast<float>(step.grad_scale);
  const float decay = static_cast<float>(step.weight_decay);
  EnsureMoments();
  if (!sharded_) {
    for (const TensorSlot& slot : layout().slots) {
      if (!slot.present) continue;
      p.weight_decay = IsDecayed(slot.tensor) ? decay : 0.0f;
      cpu::AdamWUpdate(model_.params() + slot.offset, model_.grads() + slot.offset,
                       m_.data() + slot.offset, v_.data() + slot.offset, slot.elements, p);
    }
    return absl::OkStatus();
  }
  // Elementwise: a share's elements step as they would in their whole tensors.
  int64_t at = 0;
  for (const ParamRange& r : shard_) {
    absl::StatusOr<ParamTensor> tensor = TensorAt(layout(), r);
    if (!tensor.ok()) return tensor.status();
    p.weight_decay = IsDecayed(*tensor) ? decay : 0.0f;
    cpu::AdamWUpdate(model_.params() + r.offset, model_.grads() + r.offset, m_.data() + at,
                     v_.data() + at, r.n, p);
    at += r.n;
  }
  return absl::OkStatus();
}

template <typename Stage>
absl::Status BasicCpuStageModel<Stage>::ShardOptimizerState(std::vector<ParamRange> ranges) {
  if (sharded_) return absl::FailedPreconditionError("the optimizer state is sharded already");
  int64_t held = 0;
  for (const ParamRange& r : ranges) {
    if (r.offset < 0 || r.n < 0 || r.offset + r.n > num_params()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("a ZeRO-1 share [%d, %d) outside the chunk's %d parameters", r.offset,
                          r.offset + r.n, num_params()));
    }
    FR_RETURN_IF_ERROR(TensorAt(layout(), r).status());
    held += r.n;
  }
  // New vectors, so that the memory of the whole moments goes back.
  std::vector<float> m(held), v(held);
  int64_t at = 0;
  for (const ParamRange& r : ranges) {
    if (!m_.empty()) {  // moments made already: kept; else zeros
      std::copy_n(m_.begin() + r.offset, r.n, m.begin() + at);
      std::copy_n(v_.begin() + r.offset, r.n, v.begin() + at);
    }
    at += r.n;
  }
  m_ = std::move(m);
  v_ = std::move(v);
  shard_ = std::move(ranges);
  sharded_ = true;
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
  EnsureMoments();
  std::memcpy(m, m_.data(), m_.size() * sizeof(float));
  std::memcpy(v, v_.data(), v_.size() * sizeof(float));
  return absl::OkStatus();
}
template <typename Stage>
absl::Status BasicCpuStageModel<Stage>::SetOptimizerState(const float* m, const float* v) {
  EnsureMoments();
  std::memcpy(m_.data(), m, m_.size() * sizeof(float));
  std::memcpy(v_.data(), v, v_.size() * sizeof(float));
  return absl::OkStatus();
}

template class BasicCpuStageModel<GPT2Stage<float>>;
template class BasicCpuStageModel<LlamaStage<float>>;

}  // namespace freeride
