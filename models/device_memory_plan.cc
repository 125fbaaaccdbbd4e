#include "models/device_memory_plan.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "models/cuda/vector_geometry.h"
#include "models/cuda/multi_tensor_table.h"

namespace freeride {

const char* MemoryPhaseName(MemoryPhase phase) {
  switch (phase) {
    case MemoryPhase::kParameters: return "parameters";
    case MemoryPhase::kGradients: return "gradients";
    case MemoryPhase::kOptimizer: return "optimizer";
    case MemoryPhase::kActivations: return "activations";
    case MemoryPhase::kWorkspace: return "workspace";
  }
  return "?";
}

int MemoryPlan::Add(MemoryPhase phase, std::string name, int64_t bytes) {
  int64_t& end = phase_bytes_[static_cast<int>(phase)];
  PlannedBuffer b{phase, std::move(name), end, bytes};
  end += (bytes + kAlignment - 1) / kAlignment * kAlignment;
  buffers_.push_back(std::move(b));
  return static_cast<int>(buffers_.size()) - 1;
}

int64_t MemoryPlan::TotalBytes() const {
  int64_t total = 0;
  for (int64_t b : phase_bytes_) total += b;
  return total;
}

namespace {
std::string Bytes(int64_t b) {
  if (b >= (1ll << 30)) return absl::StrFormat("%.2f GiB", b / double(1ll << 30));
  return absl::StrFormat("%.1f MiB", b / double(1ll << 20));
}
}  // namespace

std::string MemoryPlan::Report() const {
  std::vector<std::string> parts;
  for (int p = 0; p < kNumMemoryPhases; ++p) {
    parts.push_back(absl::StrFormat("%s %s", MemoryPhaseName(static_cast<MemoryPhase>(p)),
                                    Bytes(phase_bytes_[p])));
  }
  return absl::StrFormat("%s = %s", absl::StrJoin(parts, ", "), Bytes(TotalBytes()));
}

LayerWidths StageLayerWidths(const GPT2Config& config) {
  const int64_t C = config.n_embd;
  if (!config.is_llama()) return {3 * C, 4 * C, 4 * C};
  return {C + 2 * config.kv_dim(), 2 * config.ffn_hidden, config.ffn_hidden};
}

StageBufferIds PlanStageMemory(const GPT2Config& config, const StageSpec& stage, int64_t B,
                               int64_t T, int slots, int compute_bytes, MemoryPlan* plan,
                               bool training, cuda::AttentionMode attention, Recompute recompute,
                               OptimizerShare share) {
  const ParamLayout layout = MakeParamLayout(config, stage);
  const int64_t P = layout.total, BT = B * T, C = config.n_embd, NH = config.n_head;
  const int64_t L = stage.num_layers(), Vp = config.padded_vocab_size, X = compute_bytes;
  const bool head = stage.has_head, emb = stage.has_embedding;
  const LayerWidths w = StageLayerWidths(config);
  // LayerNorm keeps each row's mean for its backward; RMSNorm has none.
  const int64_t M = config.is_llama() ? 0 : 1;
  const bool tied = TiedElements(config) > 0;
  StageBufferIds ids;
  using enum MemoryPhase;
  const int64_t G = training ? 1 : 0;  // multiplies what only training needs
  const bool sharded = share.elements >= 0;
  const int64_t moments = sharded ? share.elements : P;
  // ZeRO-1 in bf16: the fp32 master of the share only, optimizer state beside its moments (the
  // forward reads the whole compute copy). In fp32 the master is the weights: whole.
  ids.master_sharded = sharded && X < 4 && training;
  ids.master = ids.master_sharded
                   ? plan->Add(kOptimizer, "master (fp32, ZeRO-1 share)", moments * 4)
                   : plan->Add(kParameters, "master (fp32)", P * 4);
  ids.compute = plan->Add(kParameters, "compute copy", X == 4 ? 0 : P * X);
  ids.grads = plan->Add(kGradients, "gradients (fp32)", G * P * 4);
  ids.head_wte_grad = plan->Add(kGradients, "head wte gradient", head && tied ? G * Vp * C * 4 : 0);
  ids.adam_m = plan->Add(kOptimizer, sharded ? "adam m (ZeRO-1 share)" : "adam m", G * moments * 4);
  ids.adam_v = plan->Add(kOptimizer, sharded ? "adam v (ZeRO-1 share)" : "adam v", G * moments * 4);
  ids.share_table = plan->Add(
      kOptimizer, "ZeRO-1 share's AdamW table",
      sharded ? G * share.table_chunks * static_cast<int64_t>(sizeof(cuda::TensorChunk)) : 0);
  const Recompute mode = training ? recompute : Recompute::kNone;
  const bool full = mode == Recompute::kFull;
  ids.recompute = mode;
  // Full: the per-layer buffers no slot keeps, one micro-batch's worth that every slot's ids
  // name; the backward makes them again for the slot at hand.
  StageBufferIds::Slot shared{};
  if (full) {
    auto rec = [&](const char* name, int64_t bytes) {
      return plan->Add(kActivations, absl::StrFormat("recomputed %s (full, shared)", name), bytes);
    };
    shared.ln1 = rec("ln1", L * BT * C * X);
    shared.ln1_mean = rec("ln1 mean", M * L * BT * 4);
    shared.ln1_rstd = rec("ln1 rstd", L * BT * 4);
    shared.qkv = rec("qkv", L * BT * w.qkv * X);
    shared.att_lse = rec("attention log-sum-exp", L * B * NH * T * 4);
    shared.atty = rec("attention output", L * BT * C * X);
    shared.residual2 = rec("residual2", L * BT * C * X);
    shared.ln2 = rec("ln2", L * BT * C * X);
    shared.ln2_mean = rec("ln2 mean", M * L * BT * 4);
    shared.ln2_rstd = rec("ln2 rstd", L * BT * 4);
    shared.fch = rec("fch", L * BT * w.fc * X);
    shared.fch_gelu = rec("fch gelu", L * BT * w.act * X);
    // The gradient at every block's output but the stage's (that one is each slot's out_grad).
    shared.dres3 = rec("dresidual3", (L - 1) * BT * C * X);
    shared.dfch = rec("dfch", L * BT * w.fc * X);
    shared.dln2 = rec("dln2", L * BT * C * X);
    shared.dres2 = rec("dresidual2", L * BT * C * X);
    shared.dqkv = rec("dqkv", L * BT * w.qkv * X);
    shared.dln1 = rec("dln1", L * BT * C * X);
  }
  for (int i = 0; i < slots; ++i) {
    StageBufferIds::Slot s;
    auto act = [&](const char* name, int64_t bytes) {
      return plan->Add(kActivations, absl::StrFormat("slot %d %s", i, name), bytes);
    };
    // A per-layer buffer: the slot's own, or under full recomputation the shared one.
    auto layer = [&](int shared_id, const char* name, int64_t bytes) {
      return full ? shared_id : act(name, bytes);
    };
    s.tokens = act("tokens", emb ? BT * 4 : 0);
    s.targets = act("targets", head ? BT * 4 : 0);
    s.bucket_positions = act("bucket positions", emb ? BT * 4 : 0);
    s.bucket_tokens = act("bucket tokens", emb ? BT * 4 : 0);
    s.bucket_starts = act("bucket starts", emb ? (BT + 1) * 4 : 0);
    s.input = act("input", BT * C * X);
    s.ln1 = layer(shared.ln1, "ln1", L * BT * C * X);
    s.ln1_mean = layer(shared.ln1_mean, "ln1 mean", M * L * BT * 4);
    s.ln1_rstd = layer(shared.ln1_rstd, "ln1 rstd", L * BT * 4);
    s.qkv = layer(shared.qkv, "qkv", L * BT * w.qkv * X);
    s.att_lse = layer(shared.att_lse, "attention log-sum-exp", L * B * NH * T * 4);
    s.atty = layer(shared.atty, "attention output", L * BT * C * X);
    s.residual2 = layer(shared.residual2, "residual2", L * BT * C * X);
    s.ln2 = layer(shared.ln2, "ln2", L * BT * C * X);
    s.ln2_mean = layer(shared.ln2_mean, "ln2 mean", M * L * BT * 4);
    s.ln2_rstd = layer(shared.ln2_rstd, "ln2 rstd", L * BT * 4);
    s.fch = layer(shared.fch, "fch", L * BT * w.fc * X);
    // Selective: made in scratch_4c, one layer at a time (forward and BackwardWeight).
    s.fch_gelu =
        layer(shared.fch_gelu, "fch gelu", mode == Recompute::kSelective ? 0 : L * BT * w.act * X);
    s.residual3 = act("residual3", L * BT * C * X);
    s.lnf = act("lnf", head ? BT * C * X : 0);
    s.lnf_mean = act("lnf mean", head ? M * BT * 4 : 0);
    s.lnf_rstd = act("lnf rstd", head ? BT * 4 : 0);
    s.logits = act("logits", head ? BT * Vp * X : 0);
    s.logsumexp = act("logsumexp", head ? BT * 4 : 0);
    s.losses = act("losses", head ? BT * 4 : 0);
    s.dres3 = layer(shared.dres3, "dresidual3", G * L * BT * C * X);
    s.dfch = layer(shared.dfch, "dfch", G * L * BT * w.fc * X);
    s.dln2 = layer(shared.dln2, "dln2", G * L * BT * C * X);
    s.dres2 = layer(shared.dres2, "dresidual2", G * L * BT * C * X);
    s.dqkv = layer(shared.dqkv, "dqkv", G * L * BT * w.qkv * X);
    s.dln1 = layer(shared.dln1, "dln1", G * L * BT * C * X);
    s.dinput = act("dinput", G * BT * C * X);
    s.dlnf = act("dlnf", head ? G * BT * C * X : 0);
    s.out_grad = act("output gradient", full ? BT * C * X : 0);
    ids.slots.push_back(s);
  }
  ids.scratch_4c = plan->Add(kWorkspace, "scratch 4C", G * BT * w.act * X);
  ids.scratch_c = plan->Add(kWorkspace, "scratch C", BT * C * X);
  ids.flash_attention = cuda::UseFlashAttention(attention, X == 2, B, NH, C / NH, T);
  const int64_t R = ids.flash_attention ? 0 : 1;  // multiplies what only the reference path needs
  ids.attn_qkv = plan->Add(kWorkspace, "attention q k v", R * 3 * BT * C * X);
  ids.attn_dqkv = plan->Add(kWorkspace, "attention dq dk dv", R * G * 3 * BT * C * X);
  ids.attn_probs = plan->Add(kWorkspace, "attention probabilities", R * B * NH * T * T * X);
  ids.attn_scores = plan->Add(kWorkspace, "attention score gradient", R * G * B * NH * T * T * X);
  ids.attn_y = plan->Add(kWorkspace, "attention y", R * BT * C * X);
  ids.attn_rowsum =
      plan->Add(kWorkspace, "attention row sums (flash)", (1 - R) * G * B * NH * T * 4);
  const bool grouped = config.is_llama() && config.n_kv_head < NH;
  ids.attn_dkv_heads = plan->Add(kWorkspace, "attention dk dv per query head (flash, grouped)",
                                 grouped ? (1 - R) * G * 2 * BT * C * X : 0);
  // Enough for the reference kernels' chunks and for the vectorised kernels' (whichever
  // runtime.kernels picks).
  const int64_t partial_floats =
      std::max(kColumnChunks * std::max(4 * C, Vp), cuda::vec::BlockPartialFloats(BT, C, X));
  ids.column_partials = plan->Add(kWorkspace, "column partial sums", G * partial_floats * 4);
  ids.reduce_partials = plan->Add(kWorkspace, "reduction partial sums",
                                  (kReduceBlocks + 2 * (L + 2)) * 8);
  const int64_t chunks = cuda::NumTensorChunks(layout);
  ids.multi_tensor_table = plan->Add(kWorkspace, "multi-tensor table",
                                     G * cuda::TableBytes(chunks, cuda::NumGradNormUnits(stage)));
  ids.multi_tensor_partials = plan->Add(kWorkspace, "multi-tensor partial sums", G * chunks * 8);
  ids.cublaslt_workspace = plan->Add(kWorkspace, "cuBLASLt workspace", kCublasLtWorkspaceBytes);
  const int64_t rope = config.is_llama() ? T * (C / NH / 2) * 4 : 0;
  ids.rope_cos = plan->Add(kWorkspace, "rotary cos table (fp32)", rope);
  ids.rope_sin = plan->Add(kWorkspace, "rotary sin table (fp32)", rope);
  ids.discarded_norm_grads = plan->Add(kWorkspace, "discarded LayerNorm weight gradients (full)",
                                       full && !config.is_llama() ? 2 * C * 4 : 0);
  return ids;
}

}  // namespace freeride
