#include "models/llama.h"

#include <cstring>

#include "absl/strings/str_format.h"
#include "models/cpu/kernels.h"
#include "models/cpu/llama_kernels.h"

namespace freeride {

template <typename T>
struct LlamaStage<T>::Slot : DecoderSlot<T> {
  // Per layer, [L_stage, ...]. qkv holds q and k after the rotation (what attention read).
  std::vector<T> ln1, rstd1, qkv, atty, att, residual2, ln2, rstd2, h, act, residual3;
  // Output gradients stashed by BackwardInput for BackwardWeight, per layer (dqkv rotated
  // back: the gradient of the projection's output).
  std::vector<T> dres3, dh, dln2, dres2, dqkv, dln1;
};

namespace {

template <typename V>
void Resize(V& v, int64_t n) {
  v.assign(static_cast<size_t>(n), typename V::value_type{});
}

// Widths of one layer's activations per token: qkv, SwiGLU's input h and output act.
struct Widths {
  int64_t qkv, h, act;
};
Widths LayerWidths(const GPT2Config& c) {
  return {c.n_embd + 2 * c.kv_dim(), 2 * c.ffn_hidden, c.ffn_hidden};
}

}  // namespace

template <typename T>
LlamaStage<T>::LlamaStage(const GPT2Config& config, const StageSpec& stage, int64_t micro_batch,
                          int64_t seq_len, int slots)
    : DecoderStage<T>(config, stage, micro_batch, seq_len) {
  const int64_t BT = B_ * T_, C = config.n_embd, L = stage.num_layers();
  const int64_t NH = config.n_head;
  const Widths w = LayerWidths(config);
  Resize(scratch_f_, BT * w.act);
  Resize(scratch_c_, BT * C);
  cpu::RopeTables(&rope_cos_, &rope_sin_, T_, config.head_size(), config.rope_theta);
  for (int i = 0; i < slots; ++i) {
    auto s = std::make_unique<Slot>();
    for (auto* v : {&s->ln1, &s->atty, &s->residual2, &s->ln2, &s->residual3, &s->dres3, &s->dln2,
                    &s->dres2, &s->dln1}) {
      Resize(*v, L * BT * C);
    }
    for (auto* v : {&s->rstd1, &s->rstd2}) Resize(*v, L * BT);
    for (auto* v : {&s->qkv, &s->dqkv}) Resize(*v, L * BT * w.qkv);
    for (auto* v : {&s->h, &s->dh}) Resize(*v, L * BT * w.h);
    Resize(s->act, L * BT * w.act);
    Resize(s->att, L * B_ * NH * T_ * T_);
    this->AddSlot(std::move(s));
  }
}

template <typename T>
LlamaStage<T>::~LlamaStage() = default;

std::vector<HostBuffer> PlanLlamaStageMemory(const GPT2Config& config, const StageSpec& stage,
                                             int64_t micro_batch, int64_t seq_len, int slots,
                                             int64_t element_bytes) {
  const int64_t BT = micro_batch * seq_len, C = config.n_embd, L = stage.num_layers();
  const int64_t NH = config.n_head, Vp = config.padded_vocab_size, e = element_bytes;
  const Widths w = LayerWidths(config);
  const int64_t params = MakeParamLayout(config, stage).total;
  std::vector<HostBuffer> plan = {{"parameters", params * e},
                                  {"parameter gradients", params * e},
                                  {"scratch", BT * (w.act + C) * e},
                                  {"rotary tables", seq_len * config.head_size() * e}};
  if (stage.has_head && TiedElements(config) > 0) {
    plan.push_back({"head's wte gradient", Vp * C * e});
  }
  const std::string per = absl::StrFormat(" (%d slots)", slots);
  const int64_t tokens = (stage.has_embedding ? BT : 0) + (stage.has_head ? BT : 0);
  plan.push_back({"tokens and targets" + per, slots * tokens * int64_t{sizeof(int32_t)}});
  // input, dinput; 9 of [BT, C] per layer; 2 RMSNorm stats; qkv dqkv; h dh; act.
  plan.push_back(
      {"layer activations and stashed gradients" + per,
       slots *
           (2 * BT * C + L * (9 * BT * C + 2 * BT + 2 * BT * w.qkv + 2 * BT * w.h + BT * w.act)) *
           e});
  plan.push_back(
      {"attention probabilities" + per, slots * L * micro_batch * NH * seq_len * seq_len * e});
  if (stage.has_head) {
    plan.push_back({"logits and their gradient" + per, slots * 2 * BT * Vp * e});
    plan.push_back({"final RMSNorm and losses" + per, slots * (2 * BT * C + 3 * BT) * e});
  }
  return plan;
}

template <typename T>
int64_t LlamaStage<T>::HostBytes() const {
  int64_t elements = static_cast<int64_t>(scratch_f_.size() + scratch_c_.size() + rope_cos_.size() +
                                          rope_sin_.size());
  int64_t io_bytes = 0;
  for (int i = 0; i < this->slots(); ++i) {
    const Slot& s = slot_at(i);
    io_bytes += this->SlotIoBytes(s);
    for (const std::vector<T>* v :
         {&s.ln1, &s.rstd1, &s.qkv, &s.atty, &s.att, &s.residual2, &s.ln2, &s.rstd2, &s.h, &s.act,
          &s.residual3, &s.dres3, &s.dh, &s.dln2, &s.dres2, &s.dqkv, &s.dln1}) {
      elements += static_cast<int64_t>(v->size());
    }
  }
  return this->ParamBytes() + elements * static_cast<int64_t>(sizeof(T)) + io_bytes;
}

template <typename T>
void LlamaStage<T>::InitRandom(uint64_t seed) {
  InitDecoderParams(this->layout(), seed, this->params());
}

template <typename T>
const T* LlamaStage<T>::output_activations(int slot) const {
  return slot_at(slot).residual3.data() + (stage().num_layers() - 1) * B_ * T_ * config().n_embd;
}
template <typename T>
T* LlamaStage<T>::output_grad(int slot) {
  return slot_at(slot).dres3.data() + (stage().num_layers() - 1) * B_ * T_ * config().n_embd;
}

template <typename T>
const T* LlamaStage<T>::LayerInput(const Slot& s, int64_t l) const {
  const int64_t BTC = B_ * T_ * config().n_embd;
  return l == 0 ? s.input.data() : s.residual3.data() + (l - 1) * BTC;
}

// Per-layer views: parameter (gradient) pointer of tensor `t` for local layer `l`.
#define FR_P(t) (param(ParamTensor::t) + l * ParamElements(cfg, ParamTensor::t))
#define FR_G(t) (grad(ParamTensor::t) + l * ParamElements(cfg, ParamTensor::t))

template <typename T>
void LlamaStage<T>::LayerForward(Slot& s, int64_t l, const T* x) {
  const GPT2Config& cfg = config();
  const int64_t BT = B_ * T_, C = cfg.n_embd, NH = cfg.n_head, NKV = cfg.n_kv_head;
  const int64_t hs = cfg.head_size(), F = cfg.ffn_hidden;
  const Widths w = LayerWidths(cfg);
  const T eps = static_cast<T>(cfg.norm_eps);
  T* ln1 = s.ln1.data() + l * BT * C;
  T* qkv = s.qkv.data() + l * BT * w.qkv;
  T* atty = s.atty.data() + l * BT * C;
  T* res2 = s.residual2.data() + l * BT * C;
  T* ln2 = s.ln2.data() + l * BT * C;
  T* h = s.h.data() + l * BT * w.h;
  T* act = s.act.data() + l * BT * w.act;
  T* tmp = scratch_c_.data();
  cpu::RMSNormForward(ln1, s.rstd1.data() + l * BT, x, FR_P(kLn1W), eps, BT, C);
  cpu::MatmulForward<T>(qkv, ln1, FR_P(kQkvW), nullptr, BT, C, w.qkv);
  // q and k heads are adjacent at the start of each row: one rotation covers both.
  cpu::RopeInPlace(qkv, rope_cos_.data(), rope_sin_.data(), B_, T_, NH + NKV, hs, w.qkv, false);
  cpu::GqaAttentionForward(atty, s.att.data() + l * B_ * NH * T_ * T_, qkv, B_, T_, NH, NKV, hs);
  cpu::MatmulForward<T>(tmp, atty, FR_P(kAttProjW), nullptr, BT, C, C);
  cpu::ResidualForward(res2, x, tmp, BT * C);
  cpu::RMSNormForward(ln2, s.rstd2.data() + l * BT, res2, FR_P(kLn2W), eps, BT, C);
  cpu::MatmulForward<T>(h, ln2, FR_P(kFcW), nullptr, BT, C, 2 * F);
  cpu::SwiGluForward(act, h, BT, F);
  cpu::MatmulForward<T>(tmp, act, FR_P(kFcProjW), nullptr, BT, F, C);
  cpu::ResidualForward(s.residual3.data() + l * BT * C, res2, tmp, BT * C);
}

template <typename T>
double LlamaStage<T>::Forward(int slot) {
  Slot& s = slot_at(slot);
  const GPT2Config& cfg = config();
  const int64_t BT = B_ * T_, C = cfg.n_embd;
  if (stage().has_embedding) {
    cpu::EmbeddingForward(s.input.data(), s.tokens.data(), param(ParamTensor::kWte), BT, C);
  }
  for (int64_t l = 0; l < stage().num_layers(); ++l) LayerForward(s, l, LayerInput(s, l));
  if (!stage().has_head) return 0.0;
  cpu::RMSNormForward(s.lnf.data(), s.lnf_rstd.data(), output_activations(slot),
                      param(ParamTensor::kLnfW), static_cast<T>(cfg.norm_eps), BT, C);
  return this->HeadForward(s);
}

template <typename T>
void LlamaStage<T>::LayerBackwardInput(Slot& s, int64_t l, const T* x, T* dx) {
  const GPT2Config& cfg = config();
  const int64_t BT = B_ * T_, C = cfg.n_embd, NH = cfg.n_head, NKV = cfg.n_kv_head;
  const int64_t hs = cfg.head_size(), F = cfg.ffn_hidden;
  const Widths w = LayerWidths(cfg);
  const T* dres3 = s.dres3.data() + l * BT * C;
  T* dh = s.dh.data() + l * BT * w.h;
  T* dln2 = s.dln2.data() + l * BT * C;
  T* dres2 = s.dres2.data() + l * BT * C;
  T* dqkv = s.dqkv.data() + l * BT * w.qkv;
  T* dln1 = s.dln1.data() + l * BT * C;
  T* dact = scratch_f_.data();
  T* datty = scratch_c_.data();
  cpu::MatmulBackwardInput(dact, dres3, FR_P(kFcProjW), BT, F, C);
  cpu::SwiGluBackward(dh, s.h.data() + l * BT * w.h, dact, BT, F);
  cpu::MatmulBackwardInput(dln2, dh, FR_P(kFcW), BT, C, 2 * F);
  std::memcpy(dres2, dres3, BT * C * sizeof(T));
  cpu::RMSNormBackwardInput(dres2, dln2, s.residual2.data() + l * BT * C, FR_P(kLn2W),
                            s.rstd2.data() + l * BT, BT, C);
  cpu::MatmulBackwardInput(datty, dres2, FR_P(kAttProjW), BT, C, C);
  cpu::GqaAttentionBackward(dqkv, datty, s.qkv.data() + l * BT * w.qkv,
                            s.att.data() + l * B_ * NH * T_ * T_, B_, T_, NH, NKV, hs);
  cpu::RopeInPlace(dqkv, rope_cos_.data(), rope_sin_.data(), B_, T_, NH + NKV, hs, w.qkv, true);
  cpu::MatmulBackwardInput(dln1, dqkv, FR_P(kQkvW), BT, C, w.qkv);
  std::memcpy(dx, dres2, BT * C * sizeof(T));
  cpu::RMSNormBackwardInput(dx, dln1, x, FR_P(kLn1W), s.rstd1.data() + l * BT, BT, C);
}

template <typename T>
void LlamaStage<T>::BackwardInput(int slot, T loss_scale) {
  Slot& s = slot_at(slot);
  const int64_t BT = B_ * T_, C = config().n_embd, L = stage().num_layers();
  if (stage().has_head) {
    T* dout = output_grad(slot);
    this->HeadBackwardInput(s, loss_scale, dout);
    cpu::RMSNormBackwardInput(dout, s.dlnf.data(), output_activations(slot),
                              param(ParamTensor::kLnfW), s.lnf_rstd.data(), BT, C);
  }
  for (int64_t l = L - 1; l >= 0; --l) {
    T* dx = l == 0 ? s.dinput.data() : s.dres3.data() + (l - 1) * BT * C;
    LayerBackwardInput(s, l, LayerInput(s, l), dx);
  }
}

template <typename T>
void LlamaStage<T>::LayerBackwardWeight(Slot& s, int64_t l, const T* x) {
  const GPT2Config& cfg = config();
  const int64_t BT = B_ * T_, C = cfg.n_embd, F = cfg.ffn_hidden;
  const Widths w = LayerWidths(cfg);
  cpu::MatmulBackwardWeight<T>(FR_G(kFcProjW), nullptr, s.dres3.data() + l * BT * C,
                               s.act.data() + l * BT * w.act, BT, F, C);
  cpu::MatmulBackwardWeight<T>(FR_G(kFcW), nullptr, s.dh.data() + l * BT * w.h,
                               s.ln2.data() + l * BT * C, BT, C, 2 * F);
  cpu::RMSNormBackwardWeight(FR_G(kLn2W), s.dln2.data() + l * BT * C,
                             s.residual2.data() + l * BT * C, s.rstd2.data() + l * BT, BT, C);
  cpu::MatmulBackwardWeight<T>(FR_G(kAttProjW), nullptr, s.dres2.data() + l * BT * C,
                               s.atty.data() + l * BT * C, BT, C, C);
  cpu::MatmulBackwardWeight<T>(FR_G(kQkvW), nullptr, s.dqkv.data() + l * BT * w.qkv,
                               s.ln1.data() + l * BT * C, BT, C, w.qkv);
  cpu::RMSNormBackwardWeight(FR_G(kLn1W), s.dln1.data() + l * BT * C, x, s.rstd1.data() + l * BT,
                             BT, C);
}

#undef FR_P
#undef FR_G

template <typename T>
void LlamaStage<T>::BackwardWeight(int slot) {
  Slot& s = slot_at(slot);
  const int64_t BT = B_ * T_, C = config().n_embd, L = stage().num_layers();
  if (stage().has_head) {
    this->HeadBackwardWeight(s);
    cpu::RMSNormBackwardWeight(grad(ParamTensor::kLnfW), s.dlnf.data(), output_activations(slot),
                               s.lnf_rstd.data(), BT, C);
    this->WeightGradDone(0);
  }
  for (int64_t l = L - 1; l >= 0; --l) {
    LayerBackwardWeight(s, l, LayerInput(s, l));
    this->WeightGradDone(L - l);
  }
  if (stage().has_embedding) {
    cpu::EmbeddingBackwardWeight(grad(ParamTensor::kWte), s.dinput.data(), s.tokens.data(), BT, C);
    this->WeightGradDone(L + 1);
  }
}

template class LlamaStage<float>;
template class LlamaStage<double>;

}  // namespace freeride
