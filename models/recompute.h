// Activation recomputation: what a micro-batch in flight keeps from its forward until its
// backward, and what the backward computes again instead (model.recompute,
// parallel.recompute_stages; docs/training.md#memory).
//   none       every activation is kept.
//   selective  the attention probabilities [B, NH, T, T] per block (recomputed from the kept
//              q, k, v just before the block's input gradient) and the GELU's output (from
//              its kept input, just before the block's weight gradient) are not kept.
//   full       only each block's input is kept (and what the head needs); the backward runs
//              the stage's blocks forward again before differentiating them.
// The recomputation runs the forward's kernels on the forward's inputs, so losses and
// gradients are the same bits as with none. Those are the CPU backend's, for both families
// (models/gpt2.h, models/llama.h: a Llama's MLP activation is the SwiGLU output, remade from
// its kept input); the CUDA chunk never keeps the attention probabilities, and what its modes
// drop is StageBufferIds' (models/device_memory_plan.h).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "models/gpt2_config.h"

namespace freeride {

enum class Recompute { kNone, kSelective, kFull };

// "none", "selective" or "full".
absl::StatusOr<Recompute> ParseRecompute(absl::string_view name);
const char* RecomputeName(Recompute mode);

// What a per-layer tensor of a CPU stage's micro-batch is to recomputation (GPT2Stage's and
// LlamaStage's tensors each have one), which decides where each mode puts it.
enum class LayerTensorRole {
  kActivation,       // any other activation, or an output gradient I stashes for W
  kProbabilities,    // the attention probabilities [B, NH, T, T]
  kMlpActivation,    // the MLP activation's output (GELU, SwiGLU)
  kBlockOutput,      // the block's output: the next block's input
  kBlockOutputGrad,  // the gradient at the block's output (the last block's: the stage's)
};
// Whether a slot keeps the tensor from its forward to its backward under `mode`.
bool KeptPerSlot(Recompute mode, LayerTensorRole role);
// Elements of the scratch all slots share for such a tensor of `per_layer` elements per layer
// in a stage of `layers` blocks (0 where slots keep it): selective recomputes one block's
// probabilities at a time (the MLP activation goes to the family's existing MLP scratch);
// full holds every block's, and the gradient at every block's output but the last (that one,
// the stage's output gradient, stays in the slot).
int64_t RecomputeScratchElements(Recompute mode, LayerTensorRole role, int64_t per_layer,
                                 int64_t layers);

// FLOPs per token that recomputation adds to one block's training step at sequence length T,
// by Megatron's convention (the count TrainingFlopsPerToken makes for the block's forward):
// full adds the block's forward, 2 per matrix parameter and 4·T·C (GPT-2: 24·C² + 4·T·C; a
// Llama: 2·(C·(C + 2·kv) + C² + 3·C·F) + 4·T·C); selective the attention core's, 4·T·C (every
// query head's products, grouped or not; the GELU and SwiGLU are elementwise: no FLOPs in
// this model).
double RecomputeFlopsPerTokenPerBlock(const GPT2Config& config, int64_t seq_len, Recompute mode);
// The same for a CUDA chunk, which recomputes the attention probabilities in every mode (so
// none of it is the mode's): full adds the block's forward, as above; selective remakes the MLP
// activation's output, elementwise (0), or where the GELU runs in the MLP product's epilogue
// (`gelu_in_product`: bf16 GPT-2 by default) that product again, 8·C² (2 · C · 4·C).
double CudaRecomputeFlopsPerTokenPerBlock(const GPT2Config& config, int64_t seq_len, Recompute mode,
                                          bool gelu_in_product);

}  // namespace freeride
