// The Llama family's layers for the key/value-cache decoder (kv_decoder.h): RMSNorm, rotary
// embeddings applied to q and k at each token's absolute position before k enters the cache,
// grouped-query attention over a cache of n_kv_head heads, SwiGLU, the head tied to wte or its
// own matrix. Made by MakeKvDecoder for model.arch = "llama"; the arithmetic of LlamaStage's
// forward (llama.h), one position at a time.
#pragma once

#include <cstdint>

#include "models/kv_decoder.h"

namespace freeride {

// Activation values (and the rotary tables for max_len positions) LlamaDecoder carves from the
// workspace after the cache.
int64_t LlamaDecoderActivationFloats(const GPT2Config& config, int64_t batch, int64_t max_len);

template <typename T>
class LlamaDecoder final : public KvDecoder<T> {
 private:
  template <typename U>
  friend absl::StatusOr<std::unique_ptr<KvDecoder<U>>> MakeKvDecoder(const GPT2Config&, const U*,
                                                                     int64_t, int64_t, U*);
  LlamaDecoder(const GPT2Config& config, const T* params, int64_t batch, int64_t max_len,
               T* workspace);
  const T* Forward(const int32_t* tokens, int64_t t) override;

  T *rope_cos_, *rope_sin_;  // [max_len, hs/2]
  T *x_, *ln_, *rstd_, *qkv_, *atty_, *tmp_, *h_, *act_, *logits_;
};

extern template class LlamaDecoder<float>;
extern template class LlamaDecoder<double>;

}  // namespace freeride
