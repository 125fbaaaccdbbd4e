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
// gradients are the same bits as with none. Those are the CPU backend's (models/gpt2.h); the
// CUDA chunk never keeps the attention probabilities, and what its modes drop is
// StageBufferIds' (models/device_memory_plan.h).
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

// FLOPs per token that recomputation adds to one block's training step at sequence length T,
// by Megatron's convention (the count TrainingFlopsPerToken makes for the block's forward):
// full adds the block's forward, 24·C² + 4·T·C; selective the attention core's, 4·T·C (the
// GELU is elementwise: no FLOPs in this model).
double RecomputeFlopsPerTokenPerBlock(const GPT2Config& config, int64_t seq_len, Recompute mode);
// The same for a CUDA chunk, which recomputes the attention probabilities in every mode (so
// none of it is the mode's): full adds the block's forward, as above; selective remakes the MLP
// activation's output, elementwise (0), or where the GELU runs in the MLP product's epilogue
// (`gelu_in_product`: bf16 GPT-2 by default) that product again, 8·C² (2 · C · 4·C).
double CudaRecomputeFlopsPerTokenPerBlock(const GPT2Config& config, int64_t seq_len, Recompute mode,
                                          bool gelu_in_product);

}  // namespace freeride
