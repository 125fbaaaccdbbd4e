#include "models/llama.h"

#include <cstring>

#include "absl/strings/str_format.h"
#include "models/cpu/kernels.h"
#include "models/cpu/llama_kernels.h"

namespace freeride {

namespace {

// The per-layer tensors of a micro-batch, each [L_stage, ...]: activations (qkv holds q and k
// after the rotation: what attention read), then the output gradients BackwardInput stashes
// for BackwardWeight (dqkv rotated back: the gradient of the projection's output).
enum LayerTensor : int {
  kLn1,
  kRstd1,
  kQkv,
  kAtty,
  kAtt,
  kRes2,
  kLn2,
  kRstd2,
  kH,
  kAct,
  kRes3,
  kDres3,
  kDh,
  kDln2,
  kDres2,
  kDqkv,
  kDln1,
  kNumLayerTensors,
};

// Widths of one layer's activations per token: qkv, SwiGLU's input h and output act.
struct Widths {
  int64_t qkv, h, act;
};
Widths LayerWidths(const GPT2Config& c) {
  return {c.n_embd + 2 * c.kv_dim(), 2 * c.ffn_hidden, c.ffn_hidden};
}

// Elements of layer tensor `t` for one layer.
int64_t LayerTensorElements(int t, const GPT2Config& cfg, int64_t B, int64_t T) {
  const int64_t BT = B * T;
  const Widths w = LayerWidths(cfg);
  switch (t) {
    case kRstd1:
    case kRstd2:
      return BT;
    case kQkv:
    case kDqkv:
      return BT * w.qkv;
    case kAtt:
      return B * cfg.n_head * T * T;
    case kH:
    case kDh:
      return BT * w.h;
    case kAct:
      return BT * w.act;
    default:
      return BT * cfg.n_embd;
  }
}

// What layer tensor `t` is to recomputation (recompute.h decides where each mode puts it).
LayerTensorRole Role(int t) {
  switch (t) {
    case kAtt:
      return LayerTensorRole::kProbabilities;
    case kAct:
      return LayerTensorRole::kMlpActivation;
    case kRes3:
      return LayerTensorRole::kBlockOutput;
    case kDres3:
      return LayerTensorRole::kBlockOutputGrad;
    default:
      return LayerTensorRole::kActivation;
  }
}

}  // namespace

template <typename T>
struct LlamaStage<T>::Slot : DecoderSlot<T> {
  std::vector<T> layer[kNumLayerTensors];  // empty where the recompute mode does not keep it
  std::vector<T> out_grad;                 // full: the gradient at the stage's output [BTC]
};

template <typename T>
LlamaStage<T>::LlamaStage(const GPT2Config& config, const StageSpec& stage, int64_t micro_batch,
                          int64_t seq_len, int slots, Recompute recompute)
    : DecoderStage<T>(config, stage, micro_batch, seq_len),
      recompute_(recompute),
      recomputed_(kNumLayerTensors) {
  const int64_t BT = B_ * T_, C = config.n_embd, L = stage.num_layers();
  AssignZeros(scratch_f_, BT * LayerWidths(config).act);
  AssignZeros(scratch_c_, BT * C);
  cpu::RopeTables(&rope_cos_, &rope_sin_, T_, config.head_size(), config.rope_theta);
  for (int t = 0; t < kNumLayerTensors; ++t) {
    AssignZeros(
        recomputed_[t],
        RecomputeScratchElements(recompute_, Role(t), LayerTensorElements(t, config, B_, T_), L));
  }
  for (int i = 0; i < slots; ++i) {
    auto s = std::make_unique<Slot>();
    for (int t = 0; t < kNumLayerTensors; ++t) {
      if (KeptPerSlot(recompute_, Role(t)))
        AssignZeros(s->layer[t], L * LayerTensorElements(t, config, B_, T_));
    }
    if (!KeptPerSlot(recompute_, Role(kDres3))) AssignZeros(s->out_grad, BT * C);
    this->AddSlot(std::move(s));
  }
}

template <typename T>
LlamaStage<T>::~LlamaStage() = default;

std::vector<HostBuffer> PlanLlamaStageMemory(const GPT2Config& config, const StageSpec& stage,
                                             int64_t micro_batch, int64_t seq_len, int slots,
                                             int64_t element_bytes, Recompute recompute) {
  const int64_t BT = micro_batch * seq_len, C = config.n_embd, L = stage.num_layers();
  const int64_t Vp = config.padded_vocab_size, e = element_bytes;
  const Widths w = LayerWidths(config);
  const int64_t params = MakeParamLayout(config, stage).total;
  std::vector<HostBuffer> plan = {{"parameters", params * e},
                                  {"parameter gradients", params * e},
                                  {"scratch", BT * (w.act + C) * e},
                                  {"rotary tables", seq_len * config.head_size() * e}};
  if (stage.has_head && TiedElements(config) > 0) {
    plan.push_back({"head's wte gradient", Vp * C * e});
  }
  int64_t kept = 0, probabilities = 0, scratch = 0;
  for (int t = 0; t < kNumLayerTensors; ++t) {
    const int64_t per = LayerTensorElements(t, config, micro_batch, seq_len);
    if (KeptPerSlot(recompute, Role(t))) (t == kAtt ? probabilities : kept) += L * per;
    scratch += RecomputeScratchElements(recompute, Role(t), per, L);
  }
  if (!KeptPerSlot(recompute, Role(kDres3))) kept += BT * C;  // the stage's output gradient
  if (scratch > 0) {
    plan.push_back(
        {absl::StrFormat("recomputed activations (%s recompute, shared)", RecomputeName(recompute)),
         scratch * e});
  }
  const std::string per = absl::StrFormat(" (%d slots)", slots);
  const int64_t tokens = (stage.has_embedding ? BT : 0) + (stage.has_head ? BT : 0);
  plan.push_back({"tokens and targets" + per, slots * tokens * int64_t{sizeof(int32_t)}});
  // input and dinput, and every layer tensor the mode keeps.
  plan.push_back(
      {"layer activations and stashed gradients" + per, slots * (2 * BT * C + kept) * e});
  if (probabilities > 0) {
    plan.push_back({"attention probabilities" + per, slots * probabilities * e});
  }
  if (stage.has_head) {
    plan.push_back({"logits and their gradient" + per, slots * 2 * BT * Vp * e});
    plan.push_back({"final RMSNorm and losses" + per, slots * (2 * BT * C + 3 * BT) * e});
  }
  return plan;
}

template <typename T>
int64_t LlamaStage<T>::SlotBytes(int slot) const {
  const Slot& s = slot_at(slot);
  int64_t elements = static_cast<int64_t>(s.out_grad.size());
  for (const std::vector<T>& v : s.layer) elements += static_cast<int64_t>(v.size());
  return elements * static_cast<int64_t>(sizeof(T)) + this->SlotIoBytes(s);
}

template <typename T>
int64_t LlamaStage<T>::RecomputeScratchBytes() const {
  int64_t elements = 0;
  for (const std::vector<T>& v : recomputed_) elements += static_cast<int64_t>(v.size());
  return elements * static_cast<int64_t>(sizeof(T));
}

template <typename T>
int64_t LlamaStage<T>::HostBytes() const {
  const int64_t elements = static_cast<int64_t>(scratch_f_.size() + scratch_c_.size() +
                                                rope_cos_.size() + rope_sin_.size());
  int64_t bytes =
      this->ParamBytes() + elements * static_cast<int64_t>(sizeof(T)) + RecomputeScratchBytes();
  for (int i = 0; i < slots(); ++i) bytes += SlotBytes(i);
  return bytes;
}

template <typename T>
void LlamaStage<T>::InitRandom(uint64_t seed) {
  InitDecoderParams(this->layout(), seed, this->params());
}

template <typename T>
const T* LlamaStage<T>::output_activations(int slot) const {
  const Slot& s = slot_at(slot);
  return s.layer[kRes3].data() + (stage().num_layers() - 1) * B_ * T_ * config().n_embd;
}
template <typename T>
T* LlamaStage<T>::output_grad(int slot) {
  return Tensor(slot_at(slot), kDres3, stage().num_layers() - 1);
}

template <typename T>
T* LlamaStage<T>::Tensor(Slot& s, int t, int64_t l) {
  const int64_t per = LayerTensorElements(t, config(), B_, T_);
  if (!s.layer[t].empty()) return s.layer[t].data() + l * per;
  if (t == kDres3 && l == stage().num_layers() - 1) return s.out_grad.data();
  if (recompute_ == Recompute::kSelective) {
    // One layer at a time: each is recomputed just before the pass that reads it.
    return t == kAtt ? recomputed_[kAtt].data() : scratch_f_.data();
  }
  return recomputed_[t].data() + l * per;
}

template <typename T>
T* LlamaStage<T>::LayerInput(Slot& s, int64_t l) {
  return l == 0 ? s.input.data() : Tensor(s, kRes3, l - 1);
}

// Per-layer views: parameter (gradient) pointer of tensor `t` for local layer `l`, and
// activation rows.
#define FR_P(t) (param(ParamTensor::t) + l * ParamElements(cfg, ParamTensor::t))
#define FR_G(t) (grad(ParamTensor::t) + l * ParamElements(cfg, ParamTensor::t))
#define FR_A(t) Tensor(s, t, l)

template <typename T>
void LlamaStage<T>::LayerForward(Slot& s, int64_t l, const T* x, T* out) {
  const GPT2Config& cfg = config();
  const int64_t BT = B_ * T_, C = cfg.n_embd, NH = cfg.n_head, NKV = cfg.n_kv_head;
  const int64_t hs = cfg.head_size(), F = cfg.ffn_hidden;
  const Widths w = LayerWidths(cfg);
  const T eps = static_cast<T>(cfg.norm_eps);
  T* qkv = FR_A(kQkv);
  T* tmp = scratch_c_.data();
  cpu::RMSNormForward(FR_A(kLn1), FR_A(kRstd1), x, FR_P(kLn1W), eps, BT, C);
  cpu::MatmulForward<T>(qkv, FR_A(kLn1), FR_P(kQkvW), nullptr, BT, C, w.qkv);
  // q and k heads are adjacent at the start of each row: one rotation covers both.
  cpu::RopeInPlace(qkv, rope_cos_.data(), rope_sin_.data(), B_, T_, NH + NKV, hs, w.qkv, false);
  cpu::GqaAttentionForward(FR_A(kAtty), FR_A(kAtt), qkv, B_, T_, NH, NKV, hs);
  cpu::MatmulForward<T>(tmp, FR_A(kAtty), FR_P(kAttProjW), nullptr, BT, C, C);
  cpu::ResidualForward(FR_A(kRes2), x, tmp, BT * C);
  cpu::RMSNormForward(FR_A(kLn2), FR_A(kRstd2), FR_A(kRes2), FR_P(kLn2W), eps, BT, C);
  cpu::MatmulForward<T>(FR_A(kH), FR_A(kLn2), FR_P(kFcW), nullptr, BT, C, 2 * F);
  cpu::SwiGluForward(FR_A(kAct), FR_A(kH), BT, F);
  cpu::MatmulForward<T>(tmp, FR_A(kAct), FR_P(kFcProjW), nullptr, BT, F, C);
  cpu::ResidualForward(out, FR_A(kRes2), tmp, BT * C);
}

template <typename T>
double LlamaStage<T>::Forward(int slot) {
  Slot& s = slot_at(slot);
  const GPT2Config& cfg = config();
  const int64_t BT = B_ * T_, C = cfg.n_embd;
  // Under full recomputation this forward's activations overwrite the scratch, whichever
  // slot's backward they belonged to.
  scratch_slot_ = -1;
  if (stage().has_embedding) {
    cpu::EmbeddingForward(s.input.data(), s.tokens.data(), param(ParamTensor::kWte), BT, C);
  }
  for (int64_t l = 0; l < stage().num_layers(); ++l) {
    LayerForward(s, l, LayerInput(s, l), Tensor(s, kRes3, l));
  }
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
  const T* dres3 = FR_A(kDres3);
  T* dh = FR_A(kDh);
  T* dres2 = FR_A(kDres2);
  T* dqkv = FR_A(kDqkv);
  T* dln1 = FR_A(kDln1);
  T* dact = scratch_f_.data();
  T* datty = scratch_c_.data();
  if (recompute_ == Recompute::kSelective) {
    // This block's probabilities again, from its kept q, k (rotated) and v (its output, kept
    // already, goes to the scratch that datty takes next).
    cpu::GqaAttentionForward(datty, FR_A(kAtt), FR_A(kQkv), B_, T_, NH, NKV, hs);
  }
  cpu::MatmulBackwardInput(dact, dres3, FR_P(kFcProjW), BT, F, C);
  cpu::SwiGluBackward(dh, FR_A(kH), dact, BT, F);
  cpu::MatmulBackwardInput(FR_A(kDln2), dh, FR_P(kFcW), BT, C, 2 * F);
  std::memcpy(dres2, dres3, BT * C * sizeof(T));
  cpu::RMSNormBackwardInput(dres2, FR_A(kDln2), FR_A(kRes2), FR_P(kLn2W), FR_A(kRstd2), BT, C);
  cpu::MatmulBackwardInput(datty, dres2, FR_P(kAttProjW), BT, C, C);
  cpu::GqaAttentionBackward(dqkv, datty, FR_A(kQkv), FR_A(kAtt), B_, T_, NH, NKV, hs);
  cpu::RopeInPlace(dqkv, rope_cos_.data(), rope_sin_.data(), B_, T_, NH + NKV, hs, w.qkv, true);
  cpu::MatmulBackwardInput(dln1, dqkv, FR_P(kQkvW), BT, C, w.qkv);
  std::memcpy(dx, dres2, BT * C * sizeof(T));
  cpu::RMSNormBackwardInput(dx, dln1, x, FR_P(kLn1W), FR_A(kRstd1), BT, C);
}

template <typename T>
void LlamaStage<T>::RecomputeBlocks(Slot& s, bool input_grads) {
  // Each block's output goes into the slot's kept copy again, and the first block's input
  // gradient into the slot's dinput again: the same bits as are there (nobody reads them
  // meanwhile: messages are copied out before their call returns).
  const int64_t L = stage().num_layers();
  for (int64_t l = 0; l < L; ++l) LayerForward(s, l, LayerInput(s, l), Tensor(s, kRes3, l));
  if (!input_grads) return;
  for (int64_t l = L - 1; l >= 0; --l) {
    LayerBackwardInput(s, l, LayerInput(s, l), l == 0 ? s.dinput.data() : Tensor(s, kDres3, l - 1));
  }
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
  if (recompute_ == Recompute::kFull) RecomputeBlocks(s, /*input_grads=*/false);
  for (int64_t l = L - 1; l >= 0; --l) {
    T* dx = l == 0 ? s.dinput.data() : Tensor(s, kDres3, l - 1);
    LayerBackwardInput(s, l, LayerInput(s, l), dx);
  }
  if (recompute_ == Recompute::kFull) scratch_slot_ = slot;
}

template <typename T>
void LlamaStage<T>::LayerBackwardWeight(Slot& s, int64_t l, const T* x) {
  const GPT2Config& cfg = config();
  const int64_t BT = B_ * T_, C = cfg.n_embd, F = cfg.ffn_hidden;
  const Widths w = LayerWidths(cfg);
  if (recompute_ == Recompute::kSelective) cpu::SwiGluForward(FR_A(kAct), FR_A(kH), BT, F);
  cpu::MatmulBackwardWeight<T>(FR_G(kFcProjW), nullptr, FR_A(kDres3), FR_A(kAct), BT, F, C);
  cpu::MatmulBackwardWeight<T>(FR_G(kFcW), nullptr, FR_A(kDh), FR_A(kLn2), BT, C, 2 * F);
  cpu::RMSNormBackwardWeight(FR_G(kLn2W), FR_A(kDln2), FR_A(kRes2), FR_A(kRstd2), BT, C);
  cpu::MatmulBackwardWeight<T>(FR_G(kAttProjW), nullptr, FR_A(kDres2), FR_A(kAtty), BT, C, C);
  cpu::MatmulBackwardWeight<T>(FR_G(kQkvW), nullptr, FR_A(kDqkv), FR_A(kLn1), BT, C, w.qkv);
  cpu::RMSNormBackwardWeight(FR_G(kLn1W), FR_A(kDln1), x, FR_A(kRstd1), BT, C);
}

#undef FR_P
#undef FR_G
#undef FR_A

template <typename T>
void LlamaStage<T>::BackwardWeight(int slot) {
  Slot& s = slot_at(slot);
  const int64_t BT = B_ * T_, C = config().n_embd, L = stage().num_layers();
  if (recompute_ == Recompute::kFull && scratch_slot_ != slot) {
    // Another slot's backward or any forward ran since this one's BackwardInput (a deferred W).
    RecomputeBlocks(s, /*input_grads=*/true);
    scratch_slot_ = slot;
  }
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
