// Incremental decoding with a key/value cache: one new token per sequence per call, each
// layer attending over the cached keys and values of the earlier positions. For generation
// (`freeride sample`, the `gpt_infer` side task): the same arithmetic as GPT2Stage's forward,
// without recomputing the prefix.
#pragma once

#include <cstdint>
#include <vector>

#include "models/gpt2_config.h"

namespace freeride {

class GPT2Decoder {
 public:
  // `params`: the whole model in llm.c's layout. `workspace`: WorkspaceFloats(...) floats for
  // the caches and activations, or null to allocate them. Neither is owned; both must outlive
  // the decoder (a side task passes memory from its capped arena).
  GPT2Decoder(const GPT2Config& config, const float* params, int64_t batch, int64_t max_len,
              float* workspace = nullptr);
  static int64_t WorkspaceFloats(const GPT2Config& config, int64_t batch, int64_t max_len);

  // Forgets every position (a new batch of sequences).
  void Reset() { pos_ = 0; }
  int64_t position() const { return pos_; }
  int64_t max_len() const { return max_len_; }
  // Feeds tokens[batch] at the current position; returns logits [batch, padded vocab].
  // Requires position() < max_len().
  const float* Step(const int32_t* tokens);

 private:
  const float* P(ParamTensor t, int64_t layer) const;

  GPT2Config config_;
  ParamLayout layout_;
  const float* params_;
  int64_t B_, max_len_, pos_ = 0;
  std::vector<float> owned_;
  // Carved from the workspace: caches [layer, batch, position, C], then activations.
  float *k_cache_, *v_cache_, *x_, *ln_, *mean_, *rstd_, *qkv_, *atty_, *tmp_, *fch_, *gelu_,
      *logits_;
};

}  // namespace freeride
