#include "models/gpt2.h"

#include <cstring>

#include "absl/strings/str_format.h"
#include "models/cpu/kernels.h"

namespace freeride {

namespace {

// The per-layer tensors of a micro-batch, each [L_stage, ...]: activations, then the output
// gradients BackwardInput stashes for BackwardWeight.
enum LayerTensor : int {
  kLn1,
  kLn1Mean,
  kLn1Rstd,
  kQkv,
  kAtty,
  kAtt,
  kRes2,
  kLn2,
  kLn2Mean,
  kLn2Rstd,
  kFch,
  kFchGelu,
  kRes3,
  kDres3,
  kDfch,
  kDln2,
  kDres2,
  kDqkv,
  kDln1,
  kNumLayerTensors,
};

// Elements of layer tensor `t` for one layer.
int64_t LayerTensorElements(int t, const GPT2Config& cfg, int64_t B, int64_t T) {
  const int64_t BT = B * T, C = cfg.n_embd;
  switch (t) {
    case kLn1Mean:
    case kLn1Rstd:
    case kLn2Mean:
    case kLn2Rstd:
      return BT;
    case kQkv:
    case kDqkv:
      return BT * 3 * C;
    case kAtt:
      return B * cfg.n_head * T * T;
    case kFch:
    case kFchGelu:
    case kDfch:
      return BT * 4 * C;
    default:
      return BT * C;
  }
}

// What layer tensor `t` is to recomputation (recompute.h decides where each mode puts it).
LayerTensorRole Role(int t) {
  switch (t) {
    case kAtt:
      return LayerTensorRole::kProbabilities;
    case kFchGelu:
      return LayerTensorRole::kMlpActivation;
    case kRes3:
      return LayerTensorRole::kBlockOutput;
    case kDres3:
      return LayerTensorRole::kBlockOutputGrad;
    default:
      return LayerTensorRole::kActivation;
  }
}

bool KeptPerSlot(Recompute mode, int t) { return freeride::KeptPerSlot(mode, Role(t)); }

// The shared scratch for layer tensor `t` (the GELU output, under selective, goes to the 4·C
// scratch).
int64_t ScratchElements(Recompute mode, int t, int64_t per_layer, int64_t L) {
  return RecomputeScratchElements(mode, Role(t), per_layer, L);
}

}  // namespace

template <typename T>
struct GPT2Stage<T>::Slot : DecoderSlot<T> {
  std::vector<T> layer[kNumLayerTensors];  // empty where the recompute mode does not keep it
  std::vector<T> out_grad;                 // full: the gradient at the stage's output [BTC]
  std::vector<T> lnf_mean;                 // the final LayerNorm's means [BT] (head stage)
};

template <typename T>
GPT2Stage<T>::GPT2Stage(const GPT2Config& config, const StageSpec& stage, int64_t micro_batch,
                        int64_t seq_len, int slots, Recompute recompute)
    : DecoderStage<T>(config, stage, micro_batch, seq_len),
      recompute_(recompute),
      recomputed_(kNumLayerTensors) {
  const int64_t BT = B_ * T_, C = config.n_embd, L = stage.num_layers();
  AssignZeros(scratch_4c_, BT * 4 * C);
  AssignZeros(scratch_c_, BT * C);
  for (int t = 0; t < kNumLayerTensors; ++t) {
    AssignZeros(recomputed_[t],
                ScratchElements(recompute_, t, LayerTensorElements(t, config, B_, T_), L));
  }
  for (int i = 0; i < slots; ++i) {
    auto s = std::make_unique<Slot>();
    for (int t = 0; t < kNumLayerTensors; ++t) {
      if (KeptPerSlot(recompute_, t))
        AssignZeros(s->layer[t], L * LayerTensorElements(t, config, B_, T_));
    }
    if (!KeptPerSlot(recompute_, kDres3)) AssignZeros(s->out_grad, BT * C);
    if (stage.has_head) AssignZeros(s->lnf_mean, BT);
    this->AddSlot(std::move(s));
  }
}

template <typename T>
GPT2Stage<T>::~GPT2Stage() = default;

std::vector<HostBuffer> PlanGPT2StageMemory(const GPT2Config& config, const StageSpec& stage,
                                            int64_t micro_batch, int64_t seq_len, int slots,
                                            int64_t element_bytes, Recompute recompute) {
  const int64_t BT = micro_batch * seq_len, C = config.n_embd, L = stage.num_layers();
  const int64_t Vp = config.padded_vocab_size, e = element_bytes;
  const int64_t params = MakeParamLayout(config, stage).total;
  std::vector<HostBuffer> plan = {{"parameters", params * e},
                                  {"parameter gradients", params * e},
                                  {"scratch", BT * 5 * C * e}};
  if (stage.has_head) plan.push_back({"head's wte gradient", Vp * C * e});
  int64_t kept = 0, probabilities = 0, scratch = 0;
  for (int t = 0; t < kNumLayerTensors; ++t) {
    const int64_t per = LayerTensorElements(t, config, micro_batch, seq_len);
    if (KeptPerSlot(recompute, t)) (t == kAtt ? probabilities : kept) += L * per;
    scratch += ScratchElements(recompute, t, per, L);
  }
  if (!KeptPerSlot(recompute, kDres3)) kept += BT * C;  // the stage's output gradient
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
  if (probabilities > 0)
    plan.push_back({"attention probabilities" + per, slots * probabilities * e});
  if (stage.has_head) {
    plan.push_back({"logits and their gradient" + per, slots * 2 * BT * Vp * e});
    plan.push_back({"final LayerNorm and losses" + per, slots * (2 * BT * C + 4 * BT) * e});
  }
  return plan;
}

template <typename T>
int64_t GPT2Stage<T>::SlotBytes(int slot) const {
  const Slot& s = slot_at(slot);
  int64_t elements = static_cast<int64_t>(s.out_grad.size() + s.lnf_mean.size());
  for (const std::vector<T>& v : s.layer) elements += static_cast<int64_t>(v.size());
  return elements * static_cast<int64_t>(sizeof(T)) + this->SlotIoBytes(s);
}

template <typename T>
int64_t GPT2Stage<T>::RecomputeScratchBytes() const {
  int64_t elements = 0;
  for (const std::vector<T>& v : recomputed_) elements += static_cast<int64_t>(v.size());
  return elements * static_cast<int64_t>(sizeof(T));
}

template <typename T>
int64_t GPT2Stage<T>::HostBytes() const {
  const int64_t scratch = static_cast<int64_t>(scratch_4c_.size() + scratch_c_.size());
  int64_t bytes =
      this->ParamBytes() + scratch * static_cast<int64_t>(sizeof(T)) + RecomputeScratchBytes();
  for (int i = 0; i < slots(); ++i) bytes += SlotBytes(i);
  return bytes;
}

template <typename T>
void GPT2Stage<T>::InitRandom(uint64_t seed) {
  InitDecoderParams(this->layout(), seed, this->params());
}

template <typename T>
const T* GPT2Stage<T>::output_activations(int slot) const {
  const Slot& s = slot_at(slot);
  return s.layer[kRes3].data() + (stage().num_layers() - 1) * B_ * T_ * config().n_embd;
}
template <typename T>
T* GPT2Stage<T>::output_grad(int slot) {
  return OutputGrad(slot_at(slot));
}

template <typename T>
T* GPT2Stage<T>::Tensor(Slot& s, int t, int64_t l) {
  const int64_t per = LayerTensorElements(t, config(), B_, T_);
  if (!s.layer[t].empty()) return s.layer[t].data() + l * per;
  if (t == kDres3 && l == stage().num_layers() - 1) return s.out_grad.data();
  if (recompute_ == Recompute::kSelective) {
    // One layer at a time: each is recomputed just before the pass that reads it.
    return t == kAtt ? recomputed_[kAtt].data() : scratch_4c_.data();
  }
  return recomputed_[t].data() + l * per;
}

template <typename T>
T* GPT2Stage<T>::OutputGrad(Slot& s) {
  return Tensor(s, kDres3, stage().num_layers() - 1);
}

template <typename T>
T* GPT2Stage<T>::LayerInput(Slot& s, int64_t l) {
  return l == 0 ? s.input.data() : Tensor(s, kRes3, l - 1);
}

// Per-layer views: parameter pointer of tensor `t` for local layer `l`, and activation rows.
#define FR_P(t) (param(ParamTensor::t) + l * ParamElements(cfg, ParamTensor::t))
#define FR_G(t) (grad(ParamTensor::t) + l * ParamElements(cfg, ParamTensor::t))
#define FR_A(t) Tensor(s, t, l)

template <typename T>
void GPT2Stage<T>::LayerForward(Slot& s, int64_t l, const T* x, T* out) {
  const GPT2Config& cfg = config();
  const int64_t BT = B_ * T_, C = cfg.n_embd, NH = cfg.n_head;
  T* tmp = scratch_c_.data();
  cpu::LayerNormForward(FR_A(kLn1), FR_A(kLn1Mean), FR_A(kLn1Rstd), x, FR_P(kLn1W), FR_P(kLn1B), BT,
                        C);
  cpu::MatmulForward(FR_A(kQkv), FR_A(kLn1), FR_P(kQkvW), FR_P(kQkvB), BT, C, 3 * C);
  cpu::AttentionForward(FR_A(kAtty), FR_A(kAtt), FR_A(kQkv), B_, T_, C, NH);
  cpu::MatmulForward(tmp, FR_A(kAtty), FR_P(kAttProjW), FR_P(kAttProjB), BT, C, C);
  cpu::ResidualForward(FR_A(kRes2), x, tmp, BT * C);
  cpu::LayerNormForward(FR_A(kLn2), FR_A(kLn2Mean), FR_A(kLn2Rstd), FR_A(kRes2), FR_P(kLn2W),
                        FR_P(kLn2B), BT, C);
  cpu::MatmulForward(FR_A(kFch), FR_A(kLn2), FR_P(kFcW), FR_P(kFcB), BT, C, 4 * C);
  cpu::GeluForward(FR_A(kFchGelu), FR_A(kFch), BT * 4 * C);
  cpu::MatmulForward(tmp, FR_A(kFchGelu), FR_P(kFcProjW), FR_P(kFcProjB), BT, 4 * C, C);
  cpu::ResidualForward(out, FR_A(kRes2), tmp, BT * C);
}

template <typename T>
double GPT2Stage<T>::Forward(int slot) {
  Slot& s = slot_at(slot);
  const int64_t BT = B_ * T_, C = config().n_embd;
  // Under full recomputation this forward's activations overwrite the scratch, whichever
  // slot's backward they belonged to.
  scratch_slot_ = -1;
  if (stage().has_embedding) {
    cpu::EncoderForward(s.input.data(), s.tokens.data(), param(ParamTensor::kWte),
                        param(ParamTensor::kWpe), B_, T_, C);
  }
  for (int64_t l = 0; l < stage().num_layers(); ++l) {
    LayerForward(s, l, LayerInput(s, l), Tensor(s, kRes3, l));
  }
  if (!stage().has_head) return 0.0;
  cpu::LayerNormForward(s.lnf.data(), s.lnf_mean.data(), s.lnf_rstd.data(),
                        output_activations(slot), param(ParamTensor::kLnfW),
                        param(ParamTensor::kLnfB), BT, C);
  return this->HeadForward(s);
}

template <typename T>
void GPT2Stage<T>::LayerBackwardInput(Slot& s, int64_t l, const T* x, T* dx) {
  const GPT2Config& cfg = config();
  const int64_t BT = B_ * T_, C = cfg.n_embd, NH = cfg.n_head;
  const T* dres3 = FR_A(kDres3);
  T* dfch = FR_A(kDfch);
  T* dln2 = FR_A(kDln2);
  T* dres2 = FR_A(kDres2);
  T* dqkv = FR_A(kDqkv);
  T* dln1 = FR_A(kDln1);
  T* dgelu = scratch_4c_.data();
  T* datty = scratch_c_.data();
  if (recompute_ == Recompute::kSelective) {
    // This block's probabilities again (its output, already kept, goes to the scratch that
    // datty takes next).
    cpu::AttentionForward(datty, FR_A(kAtt), FR_A(kQkv), B_, T_, C, NH);
  }
  cpu::MatmulBackwardInput(dgelu, dres3, FR_P(kFcProjW), BT, 4 * C, C);
  cpu::GeluBackward(dfch, FR_A(kFch), dgelu, BT * 4 * C);
  cpu::MatmulBackwardInput(dln2, dfch, FR_P(kFcW), BT, C, 4 * C);
  std::memcpy(dres2, dres3, BT * C * sizeof(T));
  cpu::LayerNormBackwardInput(dres2, dln2, FR_A(kRes2), FR_P(kLn2W), FR_A(kLn2Mean), FR_A(kLn2Rstd),
                              BT, C);
  cpu::MatmulBackwardInput(datty, dres2, FR_P(kAttProjW), BT, C, C);
  cpu::AttentionBackward(dqkv, datty, FR_A(kQkv), FR_A(kAtt), B_, T_, C, NH);
  cpu::MatmulBackwardInput(dln1, dqkv, FR_P(kQkvW), BT, C, 3 * C);
  std::memcpy(dx, dres2, BT * C * sizeof(T));
  cpu::LayerNormBackwardInput(dx, dln1, x, FR_P(kLn1W), FR_A(kLn1Mean), FR_A(kLn1Rstd), BT, C);
}

template <typename T>
void GPT2Stage<T>::RecomputeBlocks(Slot& s, bool input_grads) {
  // The 4·C scratch is free outside a block's input gradient: it takes the outputs nobody
  // reads again (each block's output is already kept, and the first block's input gradient
  // is the slot's dinput).
  const int64_t L = stage().num_layers();
  for (int64_t l = 0; l < L; ++l) LayerForward(s, l, LayerInput(s, l), scratch_4c_.data());
  if (!input_grads) return;
  for (int64_t l = L - 1; l >= 0; --l) {
    LayerBackwardInput(s, l, LayerInput(s, l),
                       l == 0 ? scratch_4c_.data() : Tensor(s, kDres3, l - 1));
  }
}

template <typename T>
void GPT2Stage<T>::BackwardInput(int slot, T loss_scale) {
  Slot& s = slot_at(slot);
  const int64_t BT = B_ * T_, C = config().n_embd, L = stage().num_layers();
  if (stage().has_head) {
    T* dout = output_grad(slot);
    this->HeadBackwardInput(s, loss_scale, dout);
    cpu::LayerNormBackwardInput(dout, s.dlnf.data(), output_activations(slot),
                                param(ParamTensor::kLnfW), s.lnf_mean.data(), s.lnf_rstd.data(),
                                BT, C);
  }
  if (recompute_ == Recompute::kFull) RecomputeBlocks(s, /*input_grads=*/false);
  for (int64_t l = L - 1; l >= 0; --l) {
    T* dx = l == 0 ? s.dinput.data() : Tensor(s, kDres3, l - 1);
    LayerBackwardInput(s, l, LayerInput(s, l), dx);
  }
  if (recompute_ == Recompute::kFull) scratch_slot_ = slot;
}

template <typename T>
void GPT2Stage<T>::LayerBackwardWeight(Slot& s, int64_t l, const T* x) {
  const GPT2Config& cfg = config();
  const int64_t BT = B_ * T_, C = cfg.n_embd;
  if (recompute_ == Recompute::kSelective) {
    cpu::GeluForward(FR_A(kFchGelu), FR_A(kFch), BT * 4 * C);
  }
  cpu::MatmulBackwardWeight(FR_G(kFcProjW), FR_G(kFcProjB), FR_A(kDres3), FR_A(kFchGelu), BT, 4 * C,
                            C);
  cpu::MatmulBackwardWeight(FR_G(kFcW), FR_G(kFcB), FR_A(kDfch), FR_A(kLn2), BT, C, 4 * C);
  cpu::LayerNormBackwardWeight(FR_G(kLn2W), FR_G(kLn2B), FR_A(kDln2), FR_A(kRes2), FR_A(kLn2Mean),
                               FR_A(kLn2Rstd), BT, C);
  cpu::MatmulBackwardWeight(FR_G(kAttProjW), FR_G(kAttProjB), FR_A(kDres2), FR_A(kAtty), BT, C, C);
  cpu::MatmulBackwardWeight(FR_G(kQkvW), FR_G(kQkvB), FR_A(kDqkv), FR_A(kLn1), BT, C, 3 * C);
  cpu::LayerNormBackwardWeight(FR_G(kLn1W), FR_G(kLn1B), FR_A(kDln1), x, FR_A(kLn1Mean),
                               FR_A(kLn1Rstd), BT, C);
}

#undef FR_P
#undef FR_G
#undef FR_A

template <typename T>
void GPT2Stage<T>::BackwardWeight(int slot) {
  Slot& s = slot_at(slot);
  const int64_t BT = B_ * T_, C = config().n_embd;
  if (recompute_ == Recompute::kFull && scratch_slot_ != slot) {
    // Another slot's backward ran since this one's BackwardInput (a deferred W).
    RecomputeBlocks(s, /*input_grads=*/true);
    scratch_slot_ = slot;
  }
  if (stage().has_head) {
    this->HeadBackwardWeight(s);
    cpu::LayerNormBackwardWeight(grad(ParamTensor::kLnfW), grad(ParamTensor::kLnfB),
                                 s.dlnf.data(), output_activations(slot), s.lnf_mean.data(),
                                 s.lnf_rstd.data(), BT, C);
  }
  const int64_t L = stage().num_layers();
  if (stage().has_head) this->WeightGradDone(0);
  for (int64_t l = L - 1; l >= 0; --l) {
    LayerBackwardWeight(s, l, LayerInput(s, l));
    this->WeightGradDone(L - l);
  }
  if (stage().has_embedding) {
    cpu::EncoderBackwardWeight(grad(ParamTensor::kWte), grad(ParamTensor::kWpe),
                               s.dinput.data(), s.tokens.data(), B_, T_, C);
    this->WeightGradDone(L + 1);
  }
}

template class GPT2Stage<float>;
template class GPT2Stage<double>;

}  // namespace freeride
