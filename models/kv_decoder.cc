#include "models/kv_decoder.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"
#include "models/cpu/parallel.h"
#include "models/gpt2_decoder.h"
#include "models/llama_decoder.h"

namespace freeride {

template <typename T>
KvCache<T>::KvCache(T* memory, int64_t layers, int64_t batch, int64_t max_len, int64_t kv_dim)
    : k_(memory),
      v_(memory + layers * batch * max_len * kv_dim),
      B_(batch),
      T_(max_len),
      kv_dim_(kv_dim) {}

template <typename T>
void KvCache<T>::Attend(T* out, const T* q_rows, int64_t q_stride, int64_t layer, int64_t t,
                        int64_t n_head, int64_t hs) const {
  const int64_t group = n_head / (kv_dim_ / hs), C = n_head * hs;
  const T scale = static_cast<T>(1) / std::sqrt(static_cast<T>(hs));
  // The new position's query against every cached key (causal by construction).
#pragma omp parallel for collapse(2) schedule(static) if (cpu::ParallelWorth(B_ * (t + 1) * C))
  for (int64_t b = 0; b < B_; ++b) {
    for (int64_t h = 0; h < n_head; ++h) {
      const T* q = q_rows + b * q_stride + h * hs;
      const int64_t kv = (h / group) * hs;
      std::vector<T> w(t + 1);
      T maxval = -std::numeric_limits<T>::infinity();
      for (int64_t t2 = 0; t2 <= t; ++t2) {
        const T* k = k_ + Offset(layer, b, t2) + kv;
        T dot = 0;
        for (int64_t i = 0; i < hs; ++i) dot += q[i] * k[i];
        w[t2] = dot * scale;
        maxval = std::max(maxval, w[t2]);
      }
      T sum = 0;
      for (int64_t t2 = 0; t2 <= t; ++t2) sum += (w[t2] = std::exp(w[t2] - maxval));
      T* o = out + b * C + h * hs;
      std::fill(o, o + hs, static_cast<T>(0));
      for (int64_t t2 = 0; t2 <= t; ++t2) {
        const T a = w[t2] / sum;
        const T* v = v_ + Offset(layer, b, t2) + kv;
        for (int64_t i = 0; i < hs; ++i) o[i] += a * v[i];
      }
    }
  }
}

template <typename T>
KvDecoder<T>::KvDecoder(const GPT2Config& config, const T* params, int64_t batch, int64_t max_len,
                        T* workspace, int64_t activation_floats)
    : layout_(MakeParamLayout(config, WholeModel(config))),
      params_(params),
      B_(batch),
      max_len_(max_len) {
  const int64_t cache = KvCache<T>::Floats(config.n_layer, B_, max_len_, config.kv_dim());
  if (workspace == nullptr) {
    owned_.assign(static_cast<size_t>(cache + activation_floats), static_cast<T>(0));
    workspace = owned_.data();
  }
  cache_ = KvCache<T>(workspace, config.n_layer, B_, max_len_, config.kv_dim());
  next_ = workspace + cache;
}

template <typename T>
const T* KvDecoder<T>::P(ParamTensor t, int64_t layer) const {
  return params_ + layout_.slot(t).offset +
         (IsPerLayer(t) ? layer * ParamElements(layout_.config, t) : 0);
}

template <typename T>
T* KvDecoder<T>::Take(int64_t n) {
  T* out = next_;
  next_ += n;
  return out;
}

template <typename T>
absl::StatusOr<const T*> KvDecoder<T>::Step(const int32_t* tokens) {
  if (pos_ >= max_len_) {
    return absl::OutOfRangeError(absl::StrFormat(
        "the key/value cache is full: it holds %d positions (Reset starts new sequences)",
        max_len_));
  }
  const T* logits = Forward(tokens, pos_);
  ++pos_;
  return logits;
}

int64_t KvDecoderWorkspaceFloats(const GPT2Config& config, int64_t batch, int64_t max_len) {
  return KvCache<float>::Floats(config.n_layer, batch, max_len, config.kv_dim()) +
         (config.is_llama() ? LlamaDecoderActivationFloats(config, batch, max_len)
                            : GPT2DecoderActivationFloats(config, batch));
}

template <typename T>
absl::StatusOr<std::unique_ptr<KvDecoder<T>>> MakeKvDecoder(const GPT2Config& config,
                                                            const T* params, int64_t batch,
                                                            int64_t max_len, T* workspace) {
  if (batch < 1 || max_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a key/value cache needs a batch and a length of at least 1, found %d × %d",
                        batch, max_len));
  }
  if (max_len > config.max_seq_len) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a key/value cache of %d positions is longer than the model's context "
                        "(model.max_seq_len = %d)",
                        max_len, config.max_seq_len));
  }
  if (config.is_llama()) {
    return std::unique_ptr<KvDecoder<T>>(
        new LlamaDecoder<T>(config, params, batch, max_len, workspace));
  }
  return std::unique_ptr<KvDecoder<T>>(
      new GPT2Decoder<T>(config, params, batch, max_len, workspace));
}

template class KvCache<float>;
template class KvCache<double>;
template class KvDecoder<float>;
template class KvDecoder<double>;
template absl::StatusOr<std::unique_ptr<KvDecoder<float>>> MakeKvDecoder(const GPT2Config&,
                                                                         const float*, int64_t,
                                                                         int64_t, float*);
template absl::StatusOr<std::unique_ptr<KvDecoder<double>>> MakeKvDecoder(const GPT2Config&,
                                                                          const double*, int64_t,
                                                                          int64_t, double*);

}  // namespace freeride
