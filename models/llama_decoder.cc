#include "models/llama_decoder.h"

#include <algorithm>
#include <vector>

#include "models/cpu/kernels.h"
#include "models/cpu/llama_kernels.h"

namespace freeride {
namespace {

int64_t QkvWidth(const GPT2Config& c) { return c.n_embd + 2 * c.kv_dim(); }

}  // namespace

int64_t LlamaDecoderActivationFloats(const GPT2Config& c, int64_t B, int64_t max_len) {
  const int64_t C = c.n_embd, F = c.ffn_hidden;
  // Rotary cos and sin; x, ln, atty, tmp; RMSNorm's rstd; qkv; SwiGLU's h and act; logits.
  return max_len * c.head_size() + 4 * B * C + B + B * QkvWidth(c) + 3 * B * F +
         B * c.padded_vocab_size;
}

template <typename T>
LlamaDecoder<T>::LlamaDecoder(const GPT2Config& config, const T* params, int64_t batch,
                              int64_t max_len, T* workspace)
    : KvDecoder<T>(config, params, batch, max_len, workspace,
                   LlamaDecoderActivationFloats(config, batch, max_len)) {
  const int64_t B = batch, C = config.n_embd, F = config.ffn_hidden;
  const int64_t half = config.head_size() / 2;
  // The tables LlamaStage computes for its sequence length: the same values at every position.
  std::vector<T> cos, sin;
  cpu::RopeTables(&cos, &sin, max_len, config.head_size(), config.rope_theta);
  rope_cos_ = this->Take(max_len * half), rope_sin_ = this->Take(max_len * half);
  std::copy(cos.begin(), cos.end(), rope_cos_);
  std::copy(sin.begin(), sin.end(), rope_sin_);
  x_ = this->Take(B * C), ln_ = this->Take(B * C), atty_ = this->Take(B * C);
  tmp_ = this->Take(B * C);
  rstd_ = this->Take(B);
  qkv_ = this->Take(B * QkvWidth(config));
  h_ = this->Take(2 * B * F), act_ = this->Take(B * F);
  logits_ = this->Take(B * config.padded_vocab_size);
}

template <typename T>
const T* LlamaDecoder<T>::Forward(const int32_t* tokens, int64_t t) {
  const GPT2Config& cfg = this->config();
  const int64_t B = this->B_, C = cfg.n_embd, NH = cfg.n_head, NKV = cfg.n_kv_head;
  const int64_t hs = cfg.head_size(), kv = cfg.kv_dim(), F = cfg.ffn_hidden, W = QkvWidth(cfg);
  const T eps = static_cast<T>(cfg.norm_eps);
  auto P = [this](ParamTensor tensor, int64_t layer) { return this->P(tensor, layer); };
  cpu::EmbeddingForward(x_, tokens, P(ParamTensor::kWte, 0), B, C);
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    cpu::RMSNormForward(ln_, rstd_, x_, P(ParamTensor::kLn1W, l), eps, B, C);
    cpu::MatmulForward<T>(qkv_, ln_, P(ParamTensor::kQkvW, l), nullptr, B, C, W);
    // Every row is at position t: the tables from row t rotate the q and k heads at once.
    cpu::RopeInPlace(qkv_, rope_cos_ + t * (hs / 2), rope_sin_ + t * (hs / 2), B, 1, NH + NKV, hs,
                     W, false);
    for (int64_t b = 0; b < B; ++b) {
      const T* row = qkv_ + b * W;
      std::copy(row + C, row + C + kv, this->cache_.key(l, b, t));
      std::copy(row + C + kv, row + C + 2 * kv, this->cache_.value(l, b, t));
    }
    this->cache_.Attend(atty_, qkv_, W, l, t, NH, hs);
    cpu::MatmulForward<T>(tmp_, atty_, P(ParamTensor::kAttProjW, l), nullptr, B, C, C);
    cpu::AddInPlace(x_, tmp_, B * C);
    cpu::RMSNormForward(ln_, rstd_, x_, P(ParamTensor::kLn2W, l), eps, B, C);
    cpu::MatmulForward<T>(h_, ln_, P(ParamTensor::kFcW, l), nullptr, B, C, 2 * F);
    cpu::SwiGluForward(act_, h_, B, F);
    cpu::MatmulForward<T>(tmp_, act_, P(ParamTensor::kFcProjW, l), nullptr, B, F, C);
    cpu::AddInPlace(x_, tmp_, B * C);
  }
  cpu::RMSNormForward(ln_, rstd_, x_, P(ParamTensor::kLnfW, 0), eps, B, C);
  const ParamTensor head = TiedElements(cfg) > 0 ? ParamTensor::kWte : ParamTensor::kLmHead;
  cpu::MatmulForward<T>(logits_, ln_, P(head, 0), nullptr, B, C, cfg.padded_vocab_size);
  return logits_;
}

template class LlamaDecoder<float>;
template class LlamaDecoder<double>;

}  // namespace freeride
