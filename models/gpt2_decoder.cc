#include "models/gpt2_decoder.h"

#include <algorithm>

#include "models/cpu/kernels.h"

namespace freeride {

int64_t GPT2DecoderActivationFloats(const GPT2Config& c, int64_t B) {
  const int64_t C = c.n_embd;
  // x, ln, atty, tmp; LayerNorm's mean and rstd; qkv; fch and gelu; logits.
  return 4 * B * C + 2 * B + 3 * B * C + 8 * B * C + B * c.padded_vocab_size;
}

template <typename T>
GPT2Decoder<T>::GPT2Decoder(const GPT2Config& config, const T* params, int64_t batch,
                            int64_t max_len, T* workspace)
    : KvDecoder<T>(config, params, batch, max_len, workspace,
                   GPT2DecoderActivationFloats(config, batch)) {
  const int64_t B = batch, C = config.n_embd;
  x_ = this->Take(B * C), ln_ = this->Take(B * C), atty_ = this->Take(B * C);
  tmp_ = this->Take(B * C);
  mean_ = this->Take(B), rstd_ = this->Take(B);
  qkv_ = this->Take(3 * B * C);
  fch_ = this->Take(4 * B * C), gelu_ = this->Take(4 * B * C);
  logits_ = this->Take(B * config.padded_vocab_size);
}

template <typename T>
const T* GPT2Decoder<T>::Forward(const int32_t* tokens, int64_t t) {
  const GPT2Config& cfg = this->config();
  const int64_t B = this->B_, C = cfg.n_embd, hs = cfg.head_size();
  auto P = [this](ParamTensor tensor, int64_t layer) { return this->P(tensor, layer); };
  for (int64_t b = 0; b < B; ++b) {
    const T* te = P(ParamTensor::kWte, 0) + static_cast<int64_t>(tokens[b]) * C;
    const T* pe = P(ParamTensor::kWpe, 0) + t * C;
    for (int64_t i = 0; i < C; ++i) x_[b * C + i] = te[i] + pe[i];
  }
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    cpu::LayerNormForward(ln_, mean_, rstd_, x_, P(ParamTensor::kLn1W, l), P(ParamTensor::kLn1B, l),
                          B, C);
    cpu::MatmulForward(qkv_, ln_, P(ParamTensor::kQkvW, l), P(ParamTensor::kQkvB, l), B, C, 3 * C);
    for (int64_t b = 0; b < B; ++b) {
      std::copy(qkv_ + b * 3 * C + C, qkv_ + b * 3 * C + 2 * C, this->cache_.key(l, b, t));
      std::copy(qkv_ + b * 3 * C + 2 * C, qkv_ + b * 3 * C + 3 * C, this->cache_.value(l, b, t));
    }
    this->cache_.Attend(atty_, qkv_, 3 * C, l, t, cfg.n_head, hs);
    cpu::MatmulForward(tmp_, atty_, P(ParamTensor::kAttProjW, l), P(ParamTensor::kAttProjB, l), B,
                       C, C);
    cpu::AddInPlace(x_, tmp_, B * C);
    cpu::LayerNormForward(ln_, mean_, rstd_, x_, P(ParamTensor::kLn2W, l), P(ParamTensor::kLn2B, l),
                          B, C);
    cpu::MatmulForward(fch_, ln_, P(ParamTensor::kFcW, l), P(ParamTensor::kFcB, l), B, C, 4 * C);
    cpu::GeluForward(gelu_, fch_, B * 4 * C);
    cpu::MatmulForward(tmp_, gelu_, P(ParamTensor::kFcProjW, l), P(ParamTensor::kFcProjB, l), B,
                       4 * C, C);
    cpu::AddInPlace(x_, tmp_, B * C);
  }
  cpu::LayerNormForward(ln_, mean_, rstd_, x_, P(ParamTensor::kLnfW, 0), P(ParamTensor::kLnfB, 0),
                        B, C);
  cpu::MatmulForward<T>(logits_, ln_, P(ParamTensor::kWte, 0), nullptr, B, C,
                        cfg.padded_vocab_size);
  return logits_;
}

template class GPT2Decoder<float>;
template class GPT2Decoder<double>;

}  // namespace freeride
