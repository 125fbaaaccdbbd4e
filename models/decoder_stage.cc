#include "models/decoder_stage.h"

#include <algorithm>
#include <cstring>

#include "models/cpu/kernels.h"

namespace freeride {

template <typename T>
DecoderStage<T>::DecoderStage(const GPT2Config& config, const StageSpec& stage, int64_t micro_batch,
                              int64_t seq_len)
    : layout_(MakeParamLayout(config, stage)), B_(micro_batch), T_(seq_len) {
  AssignZeros(params_, layout_.total);
  AssignZeros(grads_, layout_.total);
  if (stage.has_head && tied())
    AssignZeros(head_wte_grad_, config.padded_vocab_size * config.n_embd);
}

template <typename T>
DecoderStage<T>::~DecoderStage() = default;

template <typename T>
void DecoderStage<T>::AddSlot(std::unique_ptr<DecoderSlot<T>> slot) {
  DecoderSlot<T>& s = *slot;
  const int64_t BT = B_ * T_, C = config().n_embd, Vp = config().padded_vocab_size;
  if (stage().has_embedding) AssignZeros(s.tokens, BT);
  AssignZeros(s.input, BT * C);
  AssignZeros(s.dinput, BT * C);
  if (stage().has_head) {
    AssignZeros(s.targets, BT);
    AssignZeros(s.lnf, BT * C);
    AssignZeros(s.dlnf, BT * C);
    AssignZeros(s.lnf_rstd, BT);
    AssignZeros(s.logits, BT * Vp);
    AssignZeros(s.dlogits, BT * Vp);
    AssignZeros(s.logsumexp, BT);
    AssignZeros(s.losses, BT);
  }
  slots_.push_back(std::move(slot));
}

template <typename T>
int64_t DecoderStage<T>::ParamBytes() const {
  return static_cast<int64_t>((params_.size() + grads_.size() + head_wte_grad_.size()) * sizeof(T));
}

template <typename T>
int64_t DecoderStage<T>::SlotIoBytes(const DecoderSlot<T>& s) {
  int64_t elements = 0;
  for (const std::vector<T>* v : {&s.input, &s.dinput, &s.lnf, &s.lnf_rstd, &s.logits, &s.logsumexp,
                                  &s.losses, &s.dlnf, &s.dlogits}) {
    elements += static_cast<int64_t>(v->size());
  }
  return elements * static_cast<int64_t>(sizeof(T)) +
         static_cast<int64_t>((s.tokens.size() + s.targets.size()) * sizeof(int32_t));
}

template <typename T>
void DecoderStage<T>::ZeroGrads() {
  std::fill(grads_.begin(), grads_.end(), static_cast<T>(0));
  std::fill(head_wte_grad_.begin(), head_wte_grad_.end(), static_cast<T>(0));
}

template <typename T>
double DecoderStage<T>::HeadForward(DecoderSlot<T>& s) {
  const GPT2Config& cfg = config();
  const int64_t BT = B_ * T_;
  cpu::MatmulForward<T>(s.logits.data(), s.lnf.data(), head_weight(), nullptr, BT, cfg.n_embd,
                        cfg.padded_vocab_size);
  cpu::CrossEntropyForward(s.losses.data(), s.logsumexp.data(), s.logits.data(), s.targets.data(),
                           BT, cfg.vocab_size, cfg.padded_vocab_size);
  double sum = 0;
  for (int64_t i = 0; i < BT; ++i) sum += s.losses[i];
  return sum / static_cast<double>(BT);
}

template <typename T>
void DecoderStage<T>::HeadBackwardInput(DecoderSlot<T>& s, T loss_scale, T* dout) {
  const GPT2Config& cfg = config();
  const int64_t BT = B_ * T_;
  cpu::CrossEntropyBackward(s.dlogits.data(), s.logits.data(), s.logsumexp.data(), s.targets.data(),
                            loss_scale, BT, cfg.vocab_size, cfg.padded_vocab_size);
  cpu::MatmulBackwardInput(s.dlnf.data(), s.dlogits.data(), head_weight(), BT, cfg.n_embd,
                           cfg.padded_vocab_size);
  if (head_grad_in_input_) HeadGrad(s);
  std::fill(dout, dout + BT * cfg.n_embd, static_cast<T>(0));
}

template <typename T>
void DecoderStage<T>::HeadBackwardWeight(const DecoderSlot<T>& s) {
  if (!head_grad_in_input_) HeadGrad(s);
}

template <typename T>
void DecoderStage<T>::HeadGrad(const DecoderSlot<T>& s) {
  T* dst = tied() ? head_wte_grad_.data() : grad(ParamTensor::kLmHead);
  cpu::MatmulBackwardWeight<T>(dst, nullptr, s.dlogits.data(), s.lnf.data(), B_ * T_,
                               config().n_embd, config().padded_vocab_size);
}

template <typename T>
void DecoderStage<T>::WeightGradDone(int64_t part) const {
  if (weight_grad_progress_) weight_grad_progress_(static_cast<int>(part));
}

template <typename T>
void DecoderStage<T>::FoldHeadWteGrad() {
  if (!stage().has_head || !tied()) return;
  const int64_t n = static_cast<int64_t>(head_wte_grad_.size());
  if (stage().has_embedding) {
    cpu::AddInPlace(grad(ParamTensor::kWte), head_wte_grad_.data(), n);
  } else {
    std::memcpy(grad(ParamTensor::kWte), head_wte_grad_.data(), n * sizeof(T));
  }
}

template class DecoderStage<float>;
template class DecoderStage<double>;

}  // namespace freeride
