// Device memory for one model chunk, planned before anything is allocated: every buffer the
// CUDA backend uses, grouped into phases (parameters, gradients, optimizer state, activations,
// workspace) that are each one allocation, with offsets fixed here. Nothing is allocated
// inside a step. Plain C++ so that the plan (sizes, alignment, the report at start) is tested
// on machines without a GPU.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "models/cuda/stage_policy.h"
#include "models/device_reductions.h"
#include "models/gpt2_config.h"
#include "models/recompute.h"

namespace freeride {

enum class MemoryPhase : int { kParameters, kGradients, kOptimizer, kActivations, kWorkspace };
inline constexpr int kNumMemoryPhases = 5;
const char* MemoryPhaseName(MemoryPhase phase);

struct PlannedBuffer {
  MemoryPhase phase;
  std::string name;
  int64_t offset = 0;  // into the phase's allocation, a multiple of kAlignment
  int64_t bytes = 0;
};

class MemoryPlan {
 public:
  static constexpr int64_t kAlignment = 256;  // cudaMalloc's, and enough for vector loads

  // Reserves `bytes` in `phase`; returns the buffer's id. Zero-byte buffers get an id and no
  // space (their pointer is null).
  int Add(MemoryPhase phase, std::string name, int64_t bytes);
  const PlannedBuffer& buffer(int id) const { return buffers_[id]; }
  const std::vector<PlannedBuffer>& buffers() const { return buffers_; }
  int64_t PhaseBytes(MemoryPhase phase) const { return phase_bytes_[static_cast<int>(phase)]; }
  int64_t TotalBytes() const;
  // "parameters 237.4 MiB, gradients 474.8 MiB, ... = 9.1 GiB".
  std::string Report() const;

 private:
  std::vector<PlannedBuffer> buffers_;
  std::array<int64_t, kNumMemoryPhases> phase_bytes_{};
};

// Ids of every buffer of a CUDA model chunk in its MemoryPlan.
struct StageBufferIds {
  // Parameters: fp32 master copy; the compute copy (bf16; the master itself in fp32).
  int master = -1, compute = -1;
  // ZeRO-1 in bf16: `master` holds the share's elements only, packed as the moments are (in
  // the optimizer phase); the compute copy stays whole.
  bool master_sharded = false;
  int grads = -1, head_wte_grad = -1;  // fp32 always; no head_wte_grad for an untied head
  int adam_m = -1, adam_v = -1;
  // ZeRO-1: AdamW's table over the share (cuda::MakeShareTable); no space otherwise.
  int share_table = -1;
  struct Slot {
    int tokens, targets;  // int32 [BT]
    // Token positions sorted by token for a deterministic embedding backward: positions
    // [BT], the distinct tokens [BT], each one's first position in the sorted list [BT + 1].
    int bucket_positions, bucket_tokens, bucket_starts;
    int input;  // [BT·C]
    // Per layer [L, ...], compute precision (statistics fp32).
    // Llama: no means (RMSNorm), qkv holds q and k rotated (what attention read).
    int ln1, ln1_mean, ln1_rstd, qkv, att_lse, atty, residual2, ln2, ln2_mean, ln2_rstd;
    int fch, fch_gelu, residual3;
    int lnf, lnf_mean, lnf_rstd, logits, logsumexp, losses;  // head; logits become dlogits
    // Output gradients BackwardInput stashes for BackwardWeight.
    int dres3, dfch, dln2, dres2, dqkv, dln1, dinput, dlnf;
    // Full recomputation: the gradient at the stage's output [BT·C] (received from the next
    // stage, or the head's), which dres3's last layer holds otherwise.
    int out_grad;
  };
  std::vector<Slot> slots;
  // Attention by the flash kernels (cuda::UseFlashAttention): they read q, k, v from each
  // layer's qkv and write its output in place, so the reference path's buffers below get no
  // space, and backward needs only D per row (attn_rowsum).
  bool flash_attention = false;
  // Shared by every slot (one computes at a time).
  int scratch_4c = -1, scratch_c = -1;            // [BT·4C], [BT·C]
  // The reference path's: q, k, v in [B, NH, T, hs] layout (×3), and [B, NH, T, T] each the
  // probabilities of the layer at hand (kept for no layer: backward recomputes them from the
  // scores and each row's log-sum-exp) and their gradient.
  int attn_qkv = -1, attn_dqkv = -1;
  int attn_probs = -1, attn_scores = -1;
  int attn_y = -1;                                // [B, NH, T, hs]
  int attn_rowsum = -1;                           // flash: fp32 [B·NH·T], Σ dout ∘ out per row
  // Flash with grouped-query heads: each query head's dK and dV [B, T, 2, NH, hs], summed per
  // group into dqkv.
  int attn_dkv_heads = -1;
  int column_partials = -1;  // fp32, the column sums' partials (both runtime.kernels paths)
  int reduce_partials = -1;                       // fp64 partial sums
  // The multi-tensor kernels' table (cuda/multi_tensor_table.h), built at Init, and the
  // gradient norm's fp64 partial per chunk.
  int multi_tensor_table = -1, multi_tensor_partials = -1;
  int cublaslt_workspace = -1;
  // Llama: the rotary tables cos and sin [T, hs/2], fp32, written once at Init.
  int rope_cos = -1, rope_sin = -1;
  // What the slots' micro-batches keep for their backward (training only; none otherwise).
  // Under kSelective no slot keeps the MLP activation's output (fch_gelu): the forward writes
  // it into scratch_4c, and BackwardWeight makes it there again. Under kFull a slot keeps its
  // input, each block's output (residual3) and out_grad; every other per-layer buffer id of
  // every slot names one shared buffer of the same size (a micro-batch's worth, made again by
  // the backward), dres3's with L − 1 layers. Every other buffer is as with kNone.
  Recompute recompute = Recompute::kNone;
  // Full, where the stage runs the fused LayerNorm backward (GPT-2): the LayerNorm weight
  // gradients a W that redoes its slot's input gradients makes again, thrown away there
  // (fp32, 2·C).
  int discarded_norm_grads = -1;
};

// The widths per token of a layer's activations that differ between the families: qkv (GPT-2
// 3C; Llama C + 2·kv_dim), the MLP's first product `fc` (4C; SwiGLU's gate and up, 2F) and its
// activation `act` (4C; F). The buffers keep GPT-2's names (fch: fc, fch_gelu: act).
struct LayerWidths {
  int64_t qkv, fc, act;
};
LayerWidths StageLayerWidths(const GPT2Config& config);

// ZeRO-1 (parallel.zero = 1): the chunk's share of the AdamW moments (and in bf16 of the fp32
// master copy), elements, and the chunks of its AdamW table (cuda::ShareTableChunks);
// `elements` < 0: the whole moments and master, no table.
struct OptimizerShare {
  int64_t elements = -1;
  int64_t table_chunks = 0;
};

// The plan of a chunk of `config` for stage `stage`, micro-batch B, sequence length T, `slots`
// micro-batches in flight; `compute_bytes` = 2 (bf16) or 4 (fp32) per element of weights and
// activations. Without `training` (inference: forward only) the gradients, optimizer state,
// the gradients backward stashes and backward's workspace get no space. `attention` picks the
// attention path as CudaStage will (cuda::UseFlashAttention). `recompute` (training only):
// what the slots keep, and the shared buffers the recomputation writes (StageBufferIds).
// `share`: the moments of a ZeRO-1 share only, and in bf16 its fp32 master copy.
StageBufferIds PlanStageMemory(const GPT2Config& config, const StageSpec& stage, int64_t B,
                               int64_t T, int slots, int compute_bytes, MemoryPlan* plan,
                               bool training = true,
                               cuda::AttentionMode attention = cuda::AttentionMode::kAuto,
                               Recompute recompute = Recompute::kNone, OptimizerShare share = {});

}  // namespace freeride
