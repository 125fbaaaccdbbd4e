// GPT-2's layers for the key/value-cache decoder (kv_decoder.h): position embedding, LayerNorm,
// biased products, GELU, the head tied to wte. Made by MakeKvDecoder for model.arch = "gpt2".
#pragma once

#include <cstdint>

#include "models/kv_decoder.h"

namespace freeride {

// Activation values GPT2Decoder carves from the workspace after the cache.
int64_t GPT2DecoderActivationFloats(const GPT2Config& config, int64_t batch);

template <typename T>
class GPT2Decoder final : public KvDecoder<T> {
 private:
  template <typename U>
  friend absl::StatusOr<std::unique_ptr<KvDecoder<U>>> MakeKvDecoder(const GPT2Config&, const U*,
                                                                     int64_t, int64_t, U*);
  GPT2Decoder(const GPT2Config& config, const T* params, int64_t batch, int64_t max_len,
              T* workspace);
  const T* Forward(const int32_t* tokens, int64_t t) override;

  T *x_, *ln_, *mean_, *rstd_, *qkv_, *atty_, *tmp_, *fch_, *gelu_, *logits_;
};

extern template class GPT2Decoder<float>;
extern template class GPT2Decoder<double>;

}  // namespace freeride
