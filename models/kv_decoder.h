// Incremental decoding with a key/value cache, for every model family: one new token per
// sequence per call, each layer attending over the cached keys and values of the earlier
// positions. For generation (`freeride sample`, the `gpt_infer` and `serve` side tasks): the same
// arithmetic as the family's stage forward (GPT2Stage, LlamaStage), without recomputing the
// prefix.
//
// What the families share lives here: the cache (keys and values of every layer, batch row and
// position, n_kv_head heads wide: grouped-query attention reads one key/value head per group of
// query heads, GPT-2 is the case of one query head per group), the attention of the newest
// position over it, the position's bookkeeping and its limit, and the workspace the caches and
// activations are carved from. gpt2_decoder.h and llama_decoder.h hold each family's layers.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "models/gpt2_config.h"

namespace freeride {

// Keys and values [layer, batch, position, kv_dim] in memory the decoder carves for them.
template <typename T>
class KvCache {
 public:
  static int64_t Floats(int64_t layers, int64_t batch, int64_t max_len, int64_t kv_dim) {
    return 2 * layers * batch * max_len * kv_dim;
  }
  KvCache() = default;
  KvCache(T* memory, int64_t layers, int64_t batch, int64_t max_len, int64_t kv_dim);

  T* key(int64_t layer, int64_t b, int64_t t) { return k_ + Offset(layer, b, t); }
  T* value(int64_t layer, int64_t b, int64_t t) { return v_ + Offset(layer, b, t); }
  // out [batch, n_head·hs] = causal attention, scaled by 1/sqrt(hs), of the query heads at
  // q + b·q_stride (position t of each row) over the layer's positions [0, t]; query head h
  // reads key/value head h / (n_head / kv heads).
  void Attend(T* out, const T* q, int64_t q_stride, int64_t layer, int64_t t, int64_t n_head,
              int64_t hs) const;

 private:
  int64_t Offset(int64_t layer, int64_t b, int64_t t) const {
    return ((layer * B_ + b) * T_ + t) * kv_dim_;
  }
  T *k_ = nullptr, *v_ = nullptr;
  int64_t B_ = 0, T_ = 0, kv_dim_ = 0;
};

template <typename T>
class KvDecoder {
 public:
  virtual ~KvDecoder() = default;
  KvDecoder(const KvDecoder&) = delete;
  KvDecoder& operator=(const KvDecoder&) = delete;

  const GPT2Config& config() const { return layout_.config; }
  int64_t batch() const { return B_; }
  // Forgets every position (a new batch of sequences).
  void Reset() { pos_ = 0; }
  int64_t position() const { return pos_; }
  int64_t max_len() const { return max_len_; }
  // Feeds tokens[batch] at position(); returns the logits [batch, padded vocab] of the next
  // position (valid until the next call). At max_len(): an error saying so.
  absl::StatusOr<const T*> Step(const int32_t* tokens);

 protected:
  // `params`: the whole model in its family's layout. `workspace`: the family's
  // KvDecoderWorkspaceFloats, or null to allocate it; the cache is carved first, then the
  // family's own buffers by Take. Neither is owned; both outlive the decoder (a side task
  // passes memory from its capped arena).
  KvDecoder(const GPT2Config& config, const T* params, int64_t batch, int64_t max_len, T* workspace,
            int64_t activation_floats);
  // The family's layers at position t (< max_len) for tokens[batch]: the logits.
  virtual const T* Forward(const int32_t* tokens, int64_t t) = 0;
  // Tensor `t` of layer `layer` (0 for whole-model tensors) in the parameters.
  const T* P(ParamTensor t, int64_t layer) const;
  // The next `n` values of the workspace after the cache.
  T* Take(int64_t n);

  ParamLayout layout_;
  const T* params_;
  int64_t B_, max_len_;
  KvCache<T> cache_;

 private:
  int64_t pos_ = 0;
  std::vector<T> owned_;
  T* next_;
};

// Values of workspace (caches, then activations) the family's decoder needs.
int64_t KvDecoderWorkspaceFloats(const GPT2Config& config, int64_t batch, int64_t max_len);

// The decoder of config.arch's family for `batch` sequences of up to `max_len` positions. A
// cache longer than the model's context (model.max_seq_len) is refused: GPT-2 has no position
// embedding past it, and neither family was trained there.
template <typename T>
absl::StatusOr<std::unique_ptr<KvDecoder<T>>> MakeKvDecoder(const GPT2Config& config,
                                                            const T* params, int64_t batch,
                                                            int64_t max_len,
                                                            T* workspace = nullptr);

extern template class KvCache<float>;
extern template class KvCache<double>;
extern template class KvDecoder<float>;
extern template class KvDecoder<double>;

}  // namespace freeride
