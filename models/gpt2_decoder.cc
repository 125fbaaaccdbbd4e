#include "models/gpt2_decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "models/cpu/kernels.h"
#include "models/cpu/parallel.h"

namespace freeride {

int64_t GPT2Decoder::WorkspaceFloats(const GPT2Config& c, int64_t B, int64_t max_len) {
  const int64_t T = std::min(max_len, c.max_seq_len), C = c.n_embd;
  return 2 * c.n_layer * B * T * C + 4 * B * C + 2 * B + 3 * B * C + 8 * B * C +
         B * c.padded_vocab_size;
}

GPT2Decoder::GPT2Decoder(const GPT2Config& config, const float* params, int64_t batch,
                         int64_t max_len, float* workspace)
    : config_(config),
      layout_(MakeParamLayout(config, WholeModel(config))),
      params_(params),
      B_(batch),
      max_len_(std::min(max_len, config.max_seq_len)) {
  const int64_t C = config.n_embd, L = config.n_layer;
  if (workspace == nullptr) {
    owned_.assign(WorkspaceFloats(config, batch, max_len), 0.0f);
    workspace = owned_.data();
  }
  float* p = workspace;
  auto take = [&p](int64_t n) {
    float* out = p;
    p += n;
    return out;
  };
  k_cache_ = take(L * B_ * max_len_ * C);
  v_cache_ = take(L * B_ * max_len_ * C);
  x_ = take(B_ * C), ln_ = take(B_ * C), atty_ = take(B_ * C), tmp_ = take(B_ * C);
  mean_ = take(B_), rstd_ = take(B_);
  qkv_ = take(3 * B_ * C);
  fch_ = take(4 * B_ * C), gelu_ = take(4 * B_ * C);
  logits_ = take(B_ * config.padded_vocab_size);
}

const float* GPT2Decoder::P(ParamTensor t, int64_t layer) const {
  return params_ + layout_.slot(t).offset + (IsPerLayer(t) ? layer * ParamElements(config_, t) : 0);
}

const float* GPT2Decoder::Step(const int32_t* tokens) {
  const int64_t C = config_.n_embd, NH = config_.n_head, hs = C / NH, T = max_len_;
  const int64_t t = pos_;
  for (int64_t b = 0; b < B_; ++b) {
    const float* te = P(ParamTensor::kWte, 0) + static_cast<int64_t>(tokens[b]) * C;
    const float* pe = P(ParamTensor::kWpe, 0) + t * C;
    for (int64_t i = 0; i < C; ++i) x_[b * C + i] = te[i] + pe[i];
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int64_t l = 0; l < config_.n_layer; ++l) {
    cpu::LayerNormForward(ln_, mean_, rstd_, x_,
                          P(ParamTensor::kLn1W, l), P(ParamTensor::kLn1B, l), B_, C);
    cpu::MatmulForward(qkv_, ln_, P(ParamTensor::kQkvW, l),
                       P(ParamTensor::kQkvB, l), B_, C, 3 * C);
    float* kc = k_cache_ + l * B_ * T * C;
    float* vc = v_cache_ + l * B_ * T * C;
    for (int64_t b = 0; b < B_; ++b) {
      std::memcpy(kc + (b * T + t) * C, qkv_ + b * 3 * C + C, C * sizeof(float));
      std::memcpy(vc + (b * T + t) * C, qkv_ + b * 3 * C + 2 * C, C * sizeof(float));
    }
    // The new position's query against every cached key (causal by construction).
#pragma omp parallel for collapse(2) schedule(static) if (cpu::ParallelWorth(B_ * (t + 1) * C))
    for (int64_t b = 0; b < B_; ++b) {
      for (int64_t h = 0; h < NH; ++h) {
        const float* q = qkv_ + b * 3 * C + h * hs;
        std::vector<float> w(t + 1);
        float maxval = -std::numeric_limits<float>::infinity();
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const float* k = kc + (b * T + t2) * C + h * hs;
          float dot = 0;
          for (int64_t i = 0; i < hs; ++i) dot += q[i] * k[i];
          w[t2] = dot * scale;
          maxval = std::max(maxval, w[t2]);
        }
        float sum = 0;
        for (int64_t t2 = 0; t2 <= t; ++t2) sum += (w[t2] = std::exp(w[t2] - maxval));
        float* o = atty_ + b * C + h * hs;
        std::fill(o, o + hs, 0.0f);
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const float a = w[t2] / sum;
          const float* v = vc + (b * T + t2) * C + h * hs;
          for (int64_t i = 0; i < hs; ++i) o[i] += a * v[i];
        }
      }
    }
    cpu::MatmulForward(tmp_, atty_, P(ParamTensor::kAttProjW, l),
                       P(ParamTensor::kAttProjB, l), B_, C, C);
    cpu::AddInPlace(x_, tmp_, B_ * C);
    cpu::LayerNormForward(ln_, mean_, rstd_, x_,
                          P(ParamTensor::kLn2W, l), P(ParamTensor::kLn2B, l), B_, C);
    cpu::MatmulForward(fch_, ln_, P(ParamTensor::kFcW, l), P(ParamTensor::kFcB, l),
                       B_, C, 4 * C);
    cpu::GeluForward(gelu_, fch_, B_ * 4 * C);
    cpu::MatmulForward(tmp_, gelu_, P(ParamTensor::kFcProjW, l),
                       P(ParamTensor::kFcProjB, l), B_, 4 * C, C);
    cpu::AddInPlace(x_, tmp_, B_ * C);
  }
  cpu::LayerNormForward(ln_, mean_, rstd_, x_,
                        P(ParamTensor::kLnfW, 0), P(ParamTensor::kLnfB, 0), B_, C);
  cpu::MatmulForward<float>(logits_, ln_, P(ParamTensor::kWte, 0), nullptr, B_, C,
                            config_.padded_vocab_size);
  ++pos_;
  return logits_;
}

}  // namespace freeride
