// GPT-2's shape and its parameter layout, exactly as llm.c lays parameters out in a checkpoint,
// and the slicing of the model into pipeline stages.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace freeride {

struct GPT2Config {
  int64_t max_seq_len = 1024;
  int64_t vocab_size = 50257;
  int64_t padded_vocab_size = 50304;  // vocab_size rounded up to a multiple of 128
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;

  friend bool operator==(const GPT2Config&, const GPT2Config&) = default;
};

// Rounds the vocabulary up to a multiple of 128, as llm.c does (faster matrix products; the
// extra logits never enter the softmax).
int64_t PadVocab(int64_t vocab_size);

// A config with padded_vocab_size filled in, or an error naming the offending field.
absl::StatusOr<GPT2Config> MakeGPT2Config(int64_t n_layer, int64_t n_head, int64_t n_embd,
                                          int64_t max_seq_len, int64_t vocab_size);
absl::Status ValidateGPT2Config(const GPT2Config& config);

// The 16 parameter tensors in llm.c's checkpoint order. Per-layer tensors are stored as one
// block [n_layer, ...] each.
enum class ParamTensor : int {
  kWte, kWpe, kLn1W, kLn1B, kQkvW, kQkvB, kAttProjW, kAttProjB,
  kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB, kLnfW, kLnfB,
};
inline constexpr int kNumParamTensors = 16;
const char* ParamTensorName(ParamTensor t);
bool IsPerLayer(ParamTensor t);
// Matrices get weight decay; biases, LayerNorm parameters do not (nanoGPT's and llm.c's rule).
bool IsDecayed(ParamTensor t);

// Elements of tensor `t` for one layer (per-layer tensors) or in total (the others).
int64_t ParamElements(const GPT2Config& config, ParamTensor t);

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
// A stage holds wte when it has the embedding or the head (the head is tied to it), wpe with
// the embedding, its layers' slices of the per-layer tensors, lnf with the head. The order is
// llm.c's, so the whole model's buffer is byte-for-byte an llm.c checkpoint's payload.
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
