// The head's classifier of a CUDA chunk: the loss per row in Forward, the logits gradient for
// BackwardInput. With runtime.kernels = auto and the shape the fused kernel takes
// (classifier.h), one online-softmax pass per row makes both when ForwardTraining knows the
// loss scale, so a training step reads the logits once; else the reference kernels
// (CrossEntropyForward, CrossEntropyBackward).
#include <cmath>

#include "absl/strings/str_format.h"
#include "core/status.h"
#include "models/cuda/classifier.h"
#include "models/cuda/classifier_math.h"
#include "models/cuda/cuda_stage.h"

namespace freeride::cuda {

template <typename T>
absl::StatusOr<double> CudaStage<T>::ForwardTraining(int slot, float loss_scale) {
  FR_RETURN_IF_ERROR(RequireTraining("ForwardTraining"));
  training_loss_scale_ = loss_scale;
  absl::StatusOr<double> loss = Forward(slot);
  training_loss_scale_ = NAN;
  return loss;
}

template <typename T>
absl::Status CudaStage<T>::ClassifierForward(int slot) {
  const Slot& s = ids_.slots[slot];
  const GPT2Config& cfg = layout_.config;
  const int64_t BT = B_ * T_;
  logits_grad_scale_[slot] = NAN;
  if (fused() && classifier::ShapeSupported(BT, cfg.padded_vocab_size, sizeof(T))) {
    const bool grad = !std::isnan(training_loss_scale_);
    FR_KERNEL(kHead, FusedClassifier, Ptr<float>(s.losses), Ptr<float>(s.logsumexp),
              Ptr<T>(s.logits), Ptr<int32_t>(s.targets), grad ? training_loss_scale_ : 0.0f, grad,
              BT, cfg.vocab_size, cfg.padded_vocab_size, stream_);
    if (grad) logits_grad_scale_[slot] = training_loss_scale_;
    return absl::OkStatus();
  }
  FR_KERNEL(kHead, CrossEntropyForward, Ptr<float>(s.losses), Ptr<float>(s.logsumexp),
            Ptr<T>(s.logits), Ptr<int32_t>(s.targets), BT, cfg.vocab_size, cfg.padded_vocab_size,
            stream_);
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::ClassifierBackward(int slot, float loss_scale) {
  const Slot& s = ids_.slots[slot];
  const GPT2Config& cfg = layout_.config;
  const int64_t BT = B_ * T_;
  const float made = logits_grad_scale_[slot];
  logits_grad_scale_[slot] = NAN;
  if (!std::isnan(made)) {
    if (made == loss_scale) return absl::OkStatus();  // ForwardTraining made it
    return absl::FailedPreconditionError(absl::StrFormat(
        "BackwardInput of slot %d on %s: loss scale %g, but its ForwardTraining made the logits "
        "gradient at %g",
        slot, description_, loss_scale, made));
  }
  // The logits become their gradient in place: the probabilities never exist in memory.
  if (fused() && classifier::ShapeSupported(BT, cfg.padded_vocab_size, sizeof(T))) {
    FR_KERNEL(kHead, FusedClassifier, Ptr<float>(s.losses), Ptr<float>(s.logsumexp),
              Ptr<T>(s.logits), Ptr<int32_t>(s.targets), loss_scale, true, BT, cfg.vocab_size,
              cfg.padded_vocab_size, stream_);
    return absl::OkStatus();
  }
  FR_KERNEL(kHead, CrossEntropyBackward, Ptr<T>(s.logits), Ptr<float>(s.logsumexp),
            Ptr<int32_t>(s.targets), loss_scale, BT, cfg.vocab_size, cfg.padded_vocab_size,
            stream_);
  return absl::OkStatus();
}

// The class itself is instantiated in cuda_stage_model.cc.
#define FR_INSTANTIATE(T)                                                    \
  template absl::StatusOr<double> CudaStage<T>::ForwardTraining(int, float); \
  template absl::Status CudaStage<T>::ClassifierForward(int);                \
  template absl::Status CudaStage<T>::ClassifierBackward(int, float);
FR_INSTANTIATE(float)
FR_INSTANTIATE(bf16)
#undef FR_INSTANTIATE

}  // namespace freeride::cuda
