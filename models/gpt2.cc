#include "models/gpt2.h"

#include <cmath>
#include <cstring>
#include <random>

#include "absl/strings/str_format.h"
#include "models/cpu/kernels.h"

namespace freeride {

template <typename T>
struct GPT2Stage<T>::Slot {
  std::vector<int32_t> tokens, targets;
  std::vector<T> input;  // [BTC]: the embedding's output, or activations from the previous stage
  // Per layer, [L_stage, ...].
  std::vector<T> ln1, ln1_mean, ln1_rstd, qkv, atty, att, residual2, ln2, ln2_mean, ln2_rstd;
  std::vector<T> fch, fch_gelu, residual3;
  std::vector<T> lnf, lnf_mean, lnf_rstd, logits, logsumexp, losses;
  // Output gradients stashed by BackwardInput for BackwardWeight, per layer.
  std::vector<T> dres3, dfch, dln2, dres2, dqkv, dln1;
  std::vector<T> dinput, dlnf, dlogits;
};

namespace {
template <typename V>
void Resize(V& v, int64_t n) {
  v.assign(static_cast<size_t>(n), typename V::value_type{});
}
}  // namespace

template <typename T>
GPT2Stage<T>::GPT2Stage(const GPT2Config& config, const StageSpec& stage, int64_t micro_batch,
                        int64_t seq_len, int slots)
    : layout_(MakeParamLayout(config, stage)), B_(micro_batch), T_(seq_len) {
  const int64_t BT = B_ * T_, C = config.n_embd, L = stage.num_layers();
  const int64_t NH = config.n_head, Vp = config.padded_vocab_size;
  Resize(params_, layout_.total);
  Resize(grads_, layout_.total);
  if (stage.has_head) Resize(head_wte_grad_, Vp * C);
  Resize(scratch_4c_, BT * 4 * C);
  Resize(scratch_c_, BT * C);
  for (int i = 0; i < slots; ++i) {
    auto s = std::make_unique<Slot>();
    if (stage.has_embedding) Resize(s->tokens, BT);
    if (stage.has_head) Resize(s->targets, BT);
    Resize(s->input, BT * C);
    Resize(s->dinput, BT * C);
    for (auto* v : {&s->ln1, &s->atty, &s->residual2, &s->ln2, &s->residual3, &s->dres3,
                    &s->dln2, &s->dres2, &s->dln1}) {
      Resize(*v, L * BT * C);
    }
    for (auto* v : {&s->ln1_mean, &s->ln1_rstd, &s->ln2_mean, &s->ln2_rstd}) Resize(*v, L * BT);
    Resize(s->qkv, L * BT * 3 * C);
    Resize(s->dqkv, L * BT * 3 * C);
    Resize(s->att, L * B_ * NH * T_ * T_);
    for (auto* v : {&s->fch, &s->fch_gelu, &s->dfch}) Resize(*v, L * BT * 4 * C);
    if (stage.has_head) {
      Resize(s->lnf, BT * C);
      Resize(s->dlnf, BT * C);
      Resize(s->lnf_mean, BT);
      Resize(s->lnf_rstd, BT);
      Resize(s->logits, BT * Vp);
      Resize(s->dlogits, BT * Vp);
      Resize(s->logsumexp, BT);
      Resize(s->losses, BT);
    }
    slots_.push_back(std::move(s));
  }
}

template <typename T>
GPT2Stage<T>::~GPT2Stage() = default;

std::vector<HostBuffer> PlanGPT2StageMemory(const GPT2Config& config, const StageSpec& stage,
                                            int64_t micro_batch, int64_t seq_len, int slots,
                                            int64_t element_bytes) {
  const int64_t BT = micro_batch * seq_len, C = config.n_embd, L = stage.num_layers();
  const int64_t NH = config.n_head, Vp = config.padded_vocab_size, e = element_bytes;
  const int64_t params = MakeParamLayout(config, stage).total;
  std::vector<HostBuffer> plan = {{"parameters", params * e},
                                  {"parameter gradients", params * e},
                                  {"scratch", BT * 5 * C * e}};
  if (stage.has_head) plan.push_back({"head's wte gradient", Vp * C * e});
  const std::string per = absl::StrFormat(" (%d slots)", slots);
  const int64_t tokens = (stage.has_embedding ? BT : 0) + (stage.has_head ? BT : 0);
  plan.push_back({"tokens and targets" + per, slots * tokens * int64_t{sizeof(int32_t)}});
  // input, dinput; ln1 atty residual2 ln2 residual3 dres3 dln2 dres2 dln1; 4 LayerNorm stats;
  // qkv dqkv; fch fch_gelu dfch.
  plan.push_back({"layer activations and stashed gradients" + per,
                  slots * (2 * BT * C + L * (9 * BT * C + 4 * BT + 6 * BT * C + 12 * BT * C)) * e});
  plan.push_back({"attention probabilities" + per, slots * L * micro_batch * NH * seq_len * seq_len * e});
  if (stage.has_head) {
    plan.push_back({"logits and their gradient" + per, slots * 2 * BT * Vp * e});
    plan.push_back({"final LayerNorm and losses" + per, slots * (2 * BT * C + 4 * BT) * e});
  }
  return plan;
}

template <typename T>
int64_t GPT2Stage<T>::HostBytes() const {
  int64_t elements = static_cast<int64_t>(params_.size() + grads_.size() + head_wte_grad_.size() +
                                          scratch_4c_.size() + scratch_c_.size());
  int64_t token_bytes = 0;
  for (const auto& s : slots_) {
    token_bytes += static_cast<int64_t>((s->tokens.size() + s->targets.size()) * sizeof(int32_t));
    for (const std::vector<T>* v :
         {&s->input, &s->ln1, &s->ln1_mean, &s->ln1_rstd, &s->qkv, &s->atty, &s->att,
          &s->residual2, &s->ln2, &s->ln2_mean, &s->ln2_rstd, &s->fch, &s->fch_gelu,
          &s->residual3, &s->lnf, &s->lnf_mean, &s->lnf_rstd, &s->logits, &s->logsumexp,
          &s->losses, &s->dres3, &s->dfch, &s->dln2, &s->dres2, &s->dqkv, &s->dln1, &s->dinput,
          &s->dlnf, &s->dlogits}) {
      elements += static_cast<int64_t>(v->size());
    }
  }
  return elements * static_cast<int64_t>(sizeof(T)) + token_bytes;
}

template <typename T>
int GPT2Stage<T>::slots() const {
  return static_cast<int>(slots_.size());
}

template <typename T>
void InitGPT2Params(const ParamLayout& layout, uint64_t seed, T* params) {
  const GPT2Config& cfg = layout.config;
  const StageSpec& stage = layout.stage;
  const T residual_std = static_cast<T>(0.02 / std::sqrt(2.0 * static_cast<double>(cfg.n_layer)));
  for (int i = 0; i < kNumParamTensors; ++i) {
    const ParamTensor t = static_cast<ParamTensor>(i);
    const TensorSlot& slot = layout.slot(t);
    if (!slot.present) continue;
    const int64_t per = IsPerLayer(t) ? ParamElements(cfg, t) : slot.elements;
    const int64_t pieces = IsPerLayer(t) ? stage.num_layers() : 1;
    for (int64_t p = 0; p < pieces; ++p) {
      T* dst = params + slot.offset + p * per;
      const int64_t global_layer = IsPerLayer(t) ? stage.first_layer + p : 0;
      switch (t) {
        case ParamTensor::kLn1W: case ParamTensor::kLn2W: case ParamTensor::kLnfW:
          std::fill(dst, dst + per, static_cast<T>(1));
          continue;
        case ParamTensor::kLn1B: case ParamTensor::kLn2B: case ParamTensor::kLnfB:
        case ParamTensor::kQkvB: case ParamTensor::kAttProjB: case ParamTensor::kFcB:
        case ParamTensor::kFcProjB:
          std::fill(dst, dst + per, static_cast<T>(0));
          continue;
        default:
          break;
      }
      std::seed_seq seq{static_cast<uint64_t>(seed), static_cast<uint64_t>(i),
                        static_cast<uint64_t>(global_layer)};
      std::mt19937_64 rng(seq);
      std::normal_distribution<double> normal(0.0, 1.0);
      const bool residual = t == ParamTensor::kAttProjW || t == ParamTensor::kFcProjW;
      const T std = residual ? residual_std : static_cast<T>(0.02);
      // Padded vocabulary rows stay 0: no token indexes them and no softmax sees them.
      const int64_t n = t == ParamTensor::kWte ? cfg.vocab_size * cfg.n_embd : per;
      for (int64_t k = 0; k < n; ++k) dst[k] = static_cast<T>(normal(rng)) * std;
      std::fill(dst + n, dst + per, static_cast<T>(0));
    }
  }
}

template void InitGPT2Params<float>(const ParamLayout&, uint64_t, float*);
template void InitGPT2Params<double>(const ParamLayout&, uint64_t, double*);

template <typename T>
void GPT2Stage<T>::InitRandom(uint64_t seed) {
  InitGPT2Params(layout_, seed, params_.data());
}

template <typename T>
void GPT2Stage<T>::ZeroGrads() {
  std::fill(grads_.begin(), grads_.end(), static_cast<T>(0));
  std::fill(head_wte_grad_.begin(), head_wte_grad_.end(), static_cast<T>(0));
}

template <typename T>
int32_t* GPT2Stage<T>::tokens(int slot) {
  return slots_[slot]->tokens.data();
}
template <typename T>
int32_t* GPT2Stage<T>::targets(int slot) {
  return slots_[slot]->targets.data();
}
template <typename T>
T* GPT2Stage<T>::input_activations(int slot) {
  return slots_[slot]->input.data();
}
template <typename T>
const T* GPT2Stage<T>::output_activations(int slot) const {
  const Slot& s = *slots_[slot];
  return s.residual3.data() + (stage().num_layers() - 1) * B_ * T_ * config().n_embd;
}
template <typename T>
T* GPT2Stage<T>::output_grad(int slot) {
  Slot& s = *slots_[slot];
  return s.dres3.data() + (stage().num_layers() - 1) * B_ * T_ * config().n_embd;
}
template <typename T>
const T* GPT2Stage<T>::input_grad(int slot) const {
  return slots_[slot]->dinput.data();
}
template <typename T>
const T* GPT2Stage<T>::losses(int slot) const {
  return slots_[slot]->losses.data();
}
template <typename T>
const T* GPT2Stage<T>::logits(int slot) const {
  return slots_[slot]->logits.data();
}

template <typename T>
const T* GPT2Stage<T>::LayerInput(const Slot& s, int64_t l) const {
  const int64_t BTC = B_ * T_ * config().n_embd;
  return l == 0 ? s.input.data() : s.residual3.data() + (l - 1) * BTC;
}

// Per-layer views: parameter pointer of tensor `t` for local layer `l`, and activation rows.
#define FR_P(t) (param(ParamTensor::t) + l * ParamElements(cfg, ParamTensor::t))
#define FR_G(t) (grad(ParamTensor::t) + l * ParamElements(cfg, ParamTensor::t))

template <typename T>
void GPT2Stage<T>::LayerForward(Slot& s, int64_t l, const T* x) {
  const GPT2Config& cfg = config();
  const int64_t BT = B_ * T_, C = cfg.n_embd, NH = cfg.n_head;
  T* ln1 = s.ln1.data() + l * BT * C;
  T* qkv = s.qkv.data() + l * BT * 3 * C;
  T* atty = s.atty.data() + l * BT * C;
  T* res2 = s.residual2.data() + l * BT * C;
  T* ln2 = s.ln2.data() + l * BT * C;
  T* fch = s.fch.data() + l * BT * 4 * C;
  T* fch_gelu = s.fch_gelu.data() + l * BT * 4 * C;
  T* res3 = s.residual3.data() + l * BT * C;
  T* tmp = scratch_c_.data();
  cpu::LayerNormForward(ln1, s.ln1_mean.data() + l * BT, s.ln1_rstd.data() + l * BT, x,
                        FR_P(kLn1W), FR_P(kLn1B), BT, C);
  cpu::MatmulForward(qkv, ln1, FR_P(kQkvW), FR_P(kQkvB), BT, C, 3 * C);
  cpu::AttentionForward(atty, s.att.data() + l * B_ * NH * T_ * T_, qkv, B_, T_, C, NH);
  cpu::MatmulForward(tmp, atty, FR_P(kAttProjW), FR_P(kAttProjB), BT, C, C);
  cpu::ResidualForward(res2, x, tmp, BT * C);
  cpu::LayerNormForward(ln2, s.ln2_mean.data() + l * BT, s.ln2_rstd.data() + l * BT, res2,
                        FR_P(kLn2W), FR_P(kLn2B), BT, C);
  cpu::MatmulForward(fch, ln2, FR_P(kFcW), FR_P(kFcB), BT, C, 4 * C);
  cpu::GeluForward(fch_gelu, fch, BT * 4 * C);
  cpu::MatmulForward(tmp, fch_gelu, FR_P(kFcProjW), FR_P(kFcProjB), BT, 4 * C, C);
  cpu::ResidualForward(res3, res2, tmp, BT * C);
}

template <typename T>
double GPT2Stage<T>::Forward(int slot) {
  Slot& s = *slots_[slot];
  const GPT2Config& cfg = config();
  const int64_t BT = B_ * T_, C = cfg.n_embd;
  if (stage().has_embedding) {
    cpu::EncoderForward(s.input.data(), s.tokens.data(), param(ParamTensor::kWte),
                        param(ParamTensor::kWpe), B_, T_, C);
  }
  for (int64_t l = 0; l < stage().num_layers(); ++l) LayerForward(s, l, LayerInput(s, l));
  if (!stage().has_head) return 0.0;
  cpu::LayerNormForward(s.lnf.data(), s.lnf_mean.data(), s.lnf_rstd.data(),
                        output_activations(slot), param(ParamTensor::kLnfW),
                        param(ParamTensor::kLnfB), BT, C);
  cpu::MatmulForward<T>(s.logits.data(), s.lnf.data(), param(ParamTensor::kWte), nullptr, BT, C,
                        cfg.padded_vocab_size);
  cpu::CrossEntropyForward(s.losses.data(), s.logsumexp.data(), s.logits.data(),
                           s.targets.data(), BT, cfg.vocab_size, cfg.padded_vocab_size);
  double sum = 0;
  for (int64_t i = 0; i < BT; ++i) sum += s.losses[i];
  return sum / static_cast<double>(BT);
}

template <typename T>
void GPT2Stage<T>::LayerBackwardInput(Slot& s, int64_t l, const T* x, T* dx) {
  const GPT2Config& cfg = config();
  const int64_t BT = B_ * T_, C = cfg.n_embd, NH = cfg.n_head;
  const T* dres3 = s.dres3.data() + l * BT * C;
  T* dfch = s.dfch.data() + l * BT * 4 * C;
  T* dln2 = s.dln2.data() + l * BT * C;
  T* dres2 = s.dres2.data() + l * BT * C;
  T* dqkv = s.dqkv.data() + l * BT * 3 * C;
  T* dln1 = s.dln1.data() + l * BT * C;
  T* dgelu = scratch_4c_.data();
  T* datty = scratch_c_.data();
  cpu::MatmulBackwardInput(dgelu, dres3, FR_P(kFcProjW), BT, 4 * C, C);
  cpu::GeluBackward(dfch, s.fch.data() + l * BT * 4 * C, dgelu, BT * 4 * C);
  cpu::MatmulBackwardInput(dln2, dfch, FR_P(kFcW), BT, C, 4 * C);
  std::memcpy(dres2, dres3, BT * C * sizeof(T));
  cpu::LayerNormBackwardInput(dres2, dln2, s.residual2.data() + l * BT * C, FR_P(kLn2W),
                              s.ln2_mean.data() + l * BT, s.ln2_rstd.data() + l * BT, BT, C);
  cpu::MatmulBackwardInput(datty, dres2, FR_P(kAttProjW), BT, C, C);
  cpu::AttentionBackward(dqkv, datty, s.qkv.data() + l * BT * 3 * C,
                         s.att.data() + l * B_ * NH * T_ * T_, B_, T_, C, NH);
  cpu::MatmulBackwardInput(dln1, dqkv, FR_P(kQkvW), BT, C, 3 * C);
  std::memcpy(dx, dres2, BT * C * sizeof(T));
  cpu::LayerNormBackwardInput(dx, dln1, x, FR_P(kLn1W), s.ln1_mean.data() + l * BT,
                              s.ln1_rstd.data() + l * BT, BT, C);
}

template <typename T>
void GPT2Stage<T>::HeadWteGrad(const Slot& s) {
  const int64_t BT = B_ * T_;
  cpu::MatmulBackwardWeight<T>(head_wte_grad_.data(), nullptr, s.dlogits.data(), s.lnf.data(), BT,
                               config().n_embd, config().padded_vocab_size);
}

template <typename T>
void GPT2Stage<T>::BackwardInput(int slot, T loss_scale) {
  Slot& s = *slots_[slot];
  const GPT2Config& cfg = config();
  const int64_t BT = B_ * T_, C = cfg.n_embd, L = stage().num_layers();
  if (stage().has_head) {
    cpu::CrossEntropyBackward(s.dlogits.data(), s.logits.data(), s.logsumexp.data(),
                              s.targets.data(), loss_scale, BT, cfg.vocab_size,
                              cfg.padded_vocab_size);
    cpu::MatmulBackwardInput(s.dlnf.data(), s.dlogits.data(), param(ParamTensor::kWte), BT, C,
                             cfg.padded_vocab_size);
    if (head_grad_in_input_) HeadWteGrad(s);
    T* dout = output_grad(slot);
    std::fill(dout, dout + BT * C, static_cast<T>(0));
    cpu::LayerNormBackwardInput(dout, s.dlnf.data(), output_activations(slot),
                                param(ParamTensor::kLnfW), s.lnf_mean.data(), s.lnf_rstd.data(),
                                BT, C);
  }
  for (int64_t l = L - 1; l >= 0; --l) {
    T* dx = l == 0 ? s.dinput.data() : s.dres3.data() + (l - 1) * BT * C;
    LayerBackwardInput(s, l, LayerInput(s, l), dx);
  }
}

template <typename T>
void GPT2Stage<T>::LayerBackwardWeight(Slot& s, int64_t l, const T* x) {
  const GPT2Config& cfg = config();
  const int64_t BT = B_ * T_, C = cfg.n_embd;
  const T* dres3 = s.dres3.data() + l * BT * C;
  const T* dres2 = s.dres2.data() + l * BT * C;
  cpu::MatmulBackwardWeight(FR_G(kFcProjW), FR_G(kFcProjB), dres3,
                            s.fch_gelu.data() + l * BT * 4 * C, BT, 4 * C, C);
  cpu::MatmulBackwardWeight(FR_G(kFcW), FR_G(kFcB), s.dfch.data() + l * BT * 4 * C,
                            s.ln2.data() + l * BT * C, BT, C, 4 * C);
  cpu::LayerNormBackwardWeight(FR_G(kLn2W), FR_G(kLn2B), s.dln2.data() + l * BT * C,
                               s.residual2.data() + l * BT * C, s.ln2_mean.data() + l * BT,
                               s.ln2_rstd.data() + l * BT, BT, C);
  cpu::MatmulBackwardWeight(FR_G(kAttProjW), FR_G(kAttProjB), dres2,
                            s.atty.data() + l * BT * C, BT, C, C);
  cpu::MatmulBackwardWeight(FR_G(kQkvW), FR_G(kQkvB), s.dqkv.data() + l * BT * 3 * C,
                            s.ln1.data() + l * BT * C, BT, C, 3 * C);
  cpu::LayerNormBackwardWeight(FR_G(kLn1W), FR_G(kLn1B), s.dln1.data() + l * BT * C, x,
                               s.ln1_mean.data() + l * BT, s.ln1_rstd.data() + l * BT, BT, C);
}

#undef FR_P
#undef FR_G

template <typename T>
void GPT2Stage<T>::BackwardWeight(int slot) {
  Slot& s = *slots_[slot];
  const GPT2Config& cfg = config();
  const int64_t BT = B_ * T_, C = cfg.n_embd;
  if (stage().has_head) {
    if (!head_grad_in_input_) HeadWteGrad(s);
    cpu::LayerNormBackwardWeight(grad(ParamTensor::kLnfW), grad(ParamTensor::kLnfB),
                                 s.dlnf.data(), output_activations(slot), s.lnf_mean.data(),
                                 s.lnf_rstd.data(), BT, C);
  }
  const int64_t L = stage().num_layers();
  auto done = [&](int64_t part) {
    if (weight_grad_progress_) weight_grad_progress_(static_cast<int>(part));
  };
  if (stage().has_head) done(0);
  for (int64_t l = L - 1; l >= 0; --l) {
    LayerBackwardWeight(s, l, LayerInput(s, l));
    done(L - l);
  }
  if (stage().has_embedding) {
    cpu::EncoderBackwardWeight(grad(ParamTensor::kWte), grad(ParamTensor::kWpe),
                               s.dinput.data(), s.tokens.data(), B_, T_, C);
    done(L + 1);
  }
}

template <typename T>
void GPT2Stage<T>::FoldHeadWteGrad() {
  if (!stage().has_head) return;
  const int64_t n = static_cast<int64_t>(head_wte_grad_.size());
  if (stage().has_embedding) {
    cpu::AddInPlace(grad(ParamTensor::kWte), head_wte_grad_.data(), n);
  } else {
    std::memcpy(grad(ParamTensor::kWte), head_wte_grad_.data(), n * sizeof(T));
  }
}

template class GPT2Stage<float>;
template class GPT2Stage<double>;

}  // namespace freeride
