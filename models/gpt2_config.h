// The model's shape and its parameter layout, and the slicing of the model into pipeline stages.
// GPT-2's layout is exactly llm.c's checkpoint payload; a Llama-family model (RMSNorm, rotary
// positions, SwiGLU, grouped-query attention, no biases) uses the same tensor slots with its own
// sizes: the biases and wpe are absent, qkvw holds [q; k; v] with n_kv_head key/value heads,
// fcw holds [gate; up] of ffn_hidden rows each, and an untied head gets kLmHead.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace freeride {

enum class ModelArch : int { kGpt2 = 0, kLlama = 1 };
// "gpt2" | "llama" (model.arch's values).
const char* ModelArchName(ModelArch arch);

struct GPT2Config {
  int64_t max_seq_len = 1024;
  int64_t vocab_size = 50257;
  int64_t padded_vocab_size = 50304;  // vocab_size rounded up to a multiple of 128
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  // The Llama family's fields (GPT-2 ignores them and keeps these defaults).
  ModelArch arch = ModelArch::kGpt2;
  int64_t n_kv_head = 0;        // key/value heads; divides n_head
  double rope_theta = 10000.0;  // rotary embedding base
  double norm_eps = 1e-5;       // RMSNorm's epsilon
  int64_t ffn_hidden = 0;       // SwiGLU's hidden width
  bool tie_embeddings = true;   // the head reuses the token embedding

  bool is_llama() const { return arch == ModelArch::kLlama; }
  int64_t head_size() const { return n_embd / n_head; }
  // Width of the key (and of the value) projection: n_kv_head heads (GPT-2: n_embd).
  int64_t kv_dim() const { return is_llama() ? n_kv_head * head_size() : n_embd; }

  friend bool operator==(const GPT2Config&, const GPT2Config&) = default;
};

// Rounds the vocabulary up to a multiple of 128, as llm.c does (faster matrix products; the
// extra logits never enter the softmax).
int64_t PadVocab(int64_t vocab_size);

// A config with padded_vocab_size filled in, or an error naming the offending field.
absl::StatusOr<GPT2Config> MakeGPT2Config(int64_t n_layer, int64_t n_head, int64_t n_embd,
                                          int64_t max_seq_len, int64_t vocab_size);
absl::Status ValidateGPT2Config(const GPT2Config& config);

// Llama 3's rounding of the SwiGLU width: 2/3 of 4·n_embd, times `multiplier`, rounded up to a
// multiple of `multiple_of`.
int64_t LlamaFfnHidden(int64_t n_embd, double multiplier, int64_t multiple_of);
// A Llama-family config (padded vocabulary filled in), or an error naming the model.* key.
absl::StatusOr<GPT2Config> MakeLlamaConfig(int64_t n_layer, int64_t n_head, int64_t n_kv_head,
                                           int64_t n_embd, int64_t max_seq_len, int64_t vocab_size,
                                           int64_t ffn_hidden, double rope_theta, double norm_eps,
                                           bool tie_embeddings);

// The 16 parameter tensors in llm.c's checkpoint order. Per-layer tensors are stored as one
// block [n_layer, ...] each.
enum class ParamTensor : int {
  kWte,
  kWpe,
  kLn1W,
  kLn1B,
  kQkvW,
  kQkvB,
  kAttProjW,
  kAttProjB,
  kLn2W,
  kLn2B,
  kFcW,
  kFcB,
  kFcProjW,
  kFcProjB,
  kLnfW,
  kLnfB,
  kLmHead,  // an untied head's matrix [Vp, C] (Llama with tie_embeddings = false only)
};
inline constexpr int kNumParamTensors = 17;
const char* ParamTensorName(ParamTensor t);
bool IsPerLayer(ParamTensor t);
// Matrices get weight decay; biases, LayerNorm parameters do not (nanoGPT's and llm.c's rule).
bool IsDecayed(ParamTensor t);

// Elements of tensor `t` for one layer (per-layer tensors) or in total (the others); 0 for a
// tensor the model's family does not have.
int64_t ParamElements(const GPT2Config& config, ParamTensor t);
// Elements of the tied wte gradient the embedding and head stages sum: Vp·C, or 0 untied.
int64_t TiedElements(const GPT2Config& config);

// One pipeline stage: transformer blocks [first_layer, last_layer), plus the embedding (first
// stage) and/or the final LayerNorm and LM head (last stage). The whole model is the one-stage
// case {0, n_layer, true, true}.
struct StageSpec {
  int64_t first_layer = 0;
  int64_t last_layer = 0;
  bool has_embedding = true;
  bool has_head = true;

  int64_t num_layers() const { return last_layer - first_layer; }
  friend bool operator==(const StageSpec&, const StageSpec&) = default;
};

StageSpec WholeModel(const GPT2Config& config);
// Splits the layers into `stages` pieces: evenly (earlier stages take the remainder) when
// `layers_per_stage` is empty, else as listed (which must sum to n_layer).
absl::StatusOr<std::vector<StageSpec>> SplitIntoStages(const GPT2Config& config, int64_t stages,
                                                       const std::vector<int64_t>& layers_per_stage);

// Relative training cost (forward + backward) of the model's parts for one token.
struct PartCosts {
  double embedding = 0;
  double block = 0;  // one transformer block
  double head = 0;   // final LayerNorm, LM head and loss
};

// The FLOP model at sequence length T: a block's matrix products (24·C² per token forward)
// and attention (4·T·C), the head's 2·C·V, the embedding's gather and scatter (2·C), each
// times 3 for forward and backward.
PartCosts FlopPartCosts(const GPT2Config& config, int64_t seq_len);

// Splits the layers into `stages` contiguous pieces of at least one block that minimise the
// costliest piece, counting the embedding with the first and the head with the last; among
// equal splits, the one that gives earlier pieces more blocks.
// With `owners` (the rank each piece runs on; several pieces per rank in interleaved or V
// placements), the costliest rank's sum is minimised first, then the spread of the ranks' sums
// (their sum of squares), trying every split where they are few (at most 2·10^5), else by the
// pieces alone.
absl::StatusOr<std::vector<StageSpec>> BalancedStages(const GPT2Config& config, int64_t stages,
                                                      const PartCosts& costs,
                                                      const std::vector<int>& owners = {});

// Where each tensor a stage holds lives inside that stage's one contiguous parameter buffer.
// A stage holds wte when it has the embedding or a tied head, wpe with the embedding, its
// layers' slices of the per-layer tensors, lnf and an untied head's kLmHead with the head. The
// order is llm.c's, so GPT-2's whole buffer is byte-for-byte an llm.c checkpoint's payload.
struct TensorSlot {
  ParamTensor tensor;
  int64_t offset = 0;    // into the stage's buffer
  int64_t elements = 0;  // for this stage (per-layer tensors: num_layers × per-layer size)
  bool present = false;
};

struct ParamLayout {
  GPT2Config config;
  StageSpec stage;
  TensorSlot slots[kNumParamTensors];
  int64_t total = 0;

  const TensorSlot& slot(ParamTensor t) const { return slots[static_cast<int>(t)]; }
};

ParamLayout MakeParamLayout(const GPT2Config& config, const StageSpec& stage);

// Total parameters of the model (wte counted once, padded rows included).
int64_t NumParameters(const GPT2Config& config);

// Training FLOPs per token (forward + backward) for the whole model at sequence length T:
// 6 × matrix-product parameters + attention's 12·L·C·T (the PaLM-appendix count).
double TrainingFlopsPerToken(const GPT2Config& config, int64_t seq_len);

}  // namespace freeride
