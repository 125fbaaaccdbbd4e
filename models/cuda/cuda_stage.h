// The CUDA chunk itself, templated on the element type of weights and activations (float or
// bf16); callers use CudaStageModel. Split over seven files: cuda_stage_model.cc (memory, data
// in and out, losses), cuda_stage_passes.cc (forward and backward: GPT-2's layers, and the
// embedding, head and attention both families share), cuda_stage_llama.cc (the Llama family's
// layers), cuda_stage_recompute.cc (activation recomputation), cuda_stage_classifier.cc (the
// head's loss and logits gradient), cuda_stage_optimizer.cc (gradients, optimizer) and
// cuda_stage_zero.cc (ZeRO-1's share of the optimizer).
//
// The model family is a seam inside the passes: a stage runs its family's layer (LayerForward
// or LlamaLayerForward, and so on), its family's final norm, and its head matrix (wte, or an
// untied Llama head's own); everything else (memory plan, messages, slots, the zero-bubble
// I/W split, classifier, optimizer) is the same code for both.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

#include <array>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "models/cuda/cuda_stage_model.h"
#include "models/cuda/kernels.h"
#include "models/cuda/matmul.h"
#include "models/cuda/multi_tensor_table.h"
#include "models/grad_norm.h"

// Inside CudaStage's members: a kernel launch (it returns nothing) or a library call (it returns
// a Status) at `layer` (a local layer index, or kEmbedding, kHead, kWholeChunk), checked by
// Launched: its error names the call, the layer and the chunk.
#define FR_KERNEL(layer, kernel, ...)             \
  do {                                            \
    kernel(__VA_ARGS__);                          \
    FR_RETURN_IF_ERROR(Launched(#kernel, layer)); \
  } while (0)
#define FR_LIBRARY(layer, call, ...) FR_RETURN_IF_ERROR(Launched(#call, layer, call(__VA_ARGS__)))

namespace freeride::cuda {

template <typename T>
class CudaStage final : public CudaStageModel {
 public:
  CudaStage(const GPT2Config& config, const StageSpec& stage, int64_t micro_batch,
            int64_t seq_len, int slots, const CudaStageOptions& options);
  ~CudaStage() override;
  // Allocates the planned memory, streams and handles; the constructor only plans.
  absl::Status Init();

  const ParamLayout& layout() const override { return layout_; }
  int64_t micro_batch() const override { return B_; }
  int64_t seq_len() const override { return T_; }
  int slots() const override { return static_cast<int>(ids_.slots.size()); }
  std::string Describe() const override { return description_; }
  cudaStream_t stream() const override { return stream_; }
  int device() const override { return device_; }
  const MemoryPlan& memory_plan() const override { return plan_; }
  // The plan's, and the device message buffers handed out (outside the plan: how many a
  // schedule keeps is the executor's).
  int64_t DeviceBytes() const override { return plan_.TotalBytes() + message_device_bytes_; }

  absl::Status SetTokens(int slot, const int32_t* tokens) override;
  absl::Status SetTargets(int slot, const int32_t* targets) override;
  // Messages in T itself, through pinned host memory (the copies are DMA on the stream), or in
  // device memory for a transport that carries it (the copies stay on the device).
  MessageType message_type() const override {
    return std::is_same_v<T, float> ? MessageType::kFp32 : MessageType::kBf16;
  }
  absl::StatusOr<MessageBuffer> AllocateMessageBuffer(MessageMemory memory) override;
  absl::Status SetInputActivations(int slot, const void* x) override;
  absl::Status SetOutputGrad(int slot, const void* dy) override;
  absl::Status FinishMessageReads() override;
  absl::Status GetOutputActivations(int slot, void* y) override;
  absl::Status GetInputGrad(int slot, void* dx) override;
  void* MessageWritten() const override {
    return message_written_on_device_ ? static_cast<void*>(message_written_) : nullptr;
  }
  absl::Status GetLosses(int slot, float* losses) override;
  absl::Status GetLogitsAt(int slot, int64_t position, float* logits) override;

  absl::StatusOr<double> Forward(int slot) override;
  absl::Status ForwardKeepingLoss(int slot, std::optional<float> backward_loss_scale) override;
  absl::StatusOr<double> TakeLosses() override;
  absl::Status Drain() override;
  absl::StatusOr<double> ForwardTraining(int slot, float loss_scale) override;
  absl::Status BackwardInput(int slot, float loss_scale) override;
  absl::Status BackwardWeight(int slot) override;
  absl::Status ZeroGrads() override;
  absl::Status FoldHeadWteGrad() override;
  void SetHeadGradInBackwardInput(bool in_input) override { head_grad_in_input_ = in_input; }
  void SetWeightGradProgress(std::function<void(int part)> progress) override {
    weight_grad_progress_ = std::move(progress);
  }

  absl::StatusOr<float*> HostGrads(int64_t offset, int64_t n) override;
  absl::Status CommitHostGrads(int64_t offset, int64_t n) override;
  bool GradsOnDevice() const override { return true; }
  absl::StatusOr<float*> DeviceGrads(int64_t offset, int64_t n) override;
  absl::StatusOr<void*> GradsWritten() override;
  absl::StatusOr<bool> SumTiedOnDevice(StageModel& head) override;
  absl::StatusOr<std::vector<double>> GradSquaresByUnit() override;
  absl::Status ApplyAdamW(const AdamWStep& step) override;

  absl::Status GetParams(float* dst) override;
  absl::Status SetParams(const float* src) override;
  absl::Status GetOptimizerState(float* m, float* v) override;
  absl::Status SetOptimizerState(const float* m, const float* v) override;
  absl::Status InitRandom(uint64_t seed) override;
  CudaLedger ledger() const override { return ledger_; }

  // ZeRO-1 (cuda_stage_zero.cc): the moments of the share only (in bf16 its fp32 master too),
  // planned so from the start (CudaStageOptions::zero_share) or planned again here (the whole
  // phases freed), stepped through the share's AdamW table; the norm's chunk sums and their
  // combination by the multi-tensor kernels (the bits of zero = 0's fused norm); the
  // all-gather of the weights the forward reads, through pinned host copies (MPI) or in place.
  absl::Status ShardOptimizerState(std::vector<ParamRange> ranges) override;
  int64_t OptimizerStateElements() const override {
    return sharded_ ? share_elements_ : layout_.total;
  }
  int64_t MasterParamElements() const override {
    return ids_.master_sharded ? share_elements_ : layout_.total;
  }
  absl::Status ShardGradSquares(const std::vector<ParamRange>& ranges, double* partials) override;
  absl::StatusOr<std::vector<double>> CombineGradSquares(const double* partials) override;
  absl::StatusOr<float*> HostParams(int64_t offset, int64_t n) override;
  absl::Status CommitHostParams(int64_t offset, int64_t n) override;
  absl::StatusOr<DeviceWeights> DeviceParams(int64_t offset, int64_t n) override;

 private:
  using Slot = StageBufferIds::Slot;
  // The device pointer of a planned buffer (null for an empty one).
  template <typename U>
  U* Ptr(int id) const {
    const PlannedBuffer& b = plan_.buffer(id);
    if (b.bytes == 0) return nullptr;
    return reinterpret_cast<U*>(base_[static_cast<int>(b.phase)] + b.offset);
  }
  T* Act(int id, int64_t layer, int64_t per_layer) const { return Ptr<T>(id) + layer * per_layer; }
  float* Stat(int id, int64_t layer) const { return Ptr<float>(id) + layer * B_ * T_; }
  // Compute copy and gradient of tensor `t` for local layer `l`.
  T* P(ParamTensor t, int64_t l = 0) const;
  float* G(ParamTensor t, int64_t l = 0) const;
  const T* LayerInput(const Slot& s, int64_t l) const;
  T* OutputActivations(const Slot& s) const;
  T* OutputGrad(const Slot& s) const;
  // The gradient at local layer l's output: the next layer's input gradient, or the stage's
  // output gradient (OutputGrad) for the last layer.
  T* BlockOutputGrad(const Slot& s, int64_t l) const;
  // Where layer l's MLP activation output (GELU, SwiGLU) is: the slot's, or under selective
  // recomputation scratch_4c (one layer at a time).
  T* ActivationOutput(const Slot& s, int64_t l) const;
  // A message's n elements to the device (queued on the stream; messages_read_ marks its end)
  // or from it (into host memory complete on return: the host hands the buffer on at once;
  // into device memory queued, message_written_ marking its end).
  absl::Status Upload(T* dst, const void* src, int64_t n);
  absl::Status Download(void* dst, const T* src, int64_t n);
  absl::Status Sync();
  // Allocations, counted in the ledger.
  absl::Status DeviceAlloc(char** ptr, int64_t bytes);
  absl::Status PinnedAlloc(char** ptr, int64_t bytes);
  // Before the host rewrites a slot's pinned staging: the copy out of it that `copied` marks
  // must have run (a wait only when it has not).
  absl::Status AwaitStaging(cudaEvent_t copied);
  // The slot's pinned staging, int32 each: tokens [B·T], bucket positions [B·T], bucket tokens
  // [B·T], bucket starts [B·T + 1], targets [B·T].
  int32_t* SlotStaging(int slot) const {
    return reinterpret_cast<int32_t*>(pinned_ + kPinnedLossBytes) + slot * (5 * B_ * T_ + 1);
  }
  // The kept losses so far, added to kept_sum_ in order (a wait).
  absl::Status FoldKeptLosses();
  // Makes the chunk's device current for the calling thread: first thing in every public call.
  absl::Status Enter();
  // After a call at `layer`: the launch error CUDA holds, then (FREERIDE_CUDA_CHECK_LAUNCHES=1)
  // the stream synchronised; any error, or the library's own `status`, comes back prefixed
  // with LaunchSite and the chunk's description.
  absl::Status Launched(const char* call, int64_t layer, absl::Status status = absl::OkStatus());
  absl::Status RequireTraining(const char* what) const;
  // ZeRO-1 (cuda_stage_zero.cc): refuses a share outside the chunk or across tensors, or a
  // table whose chunks are not the norm's; the share's AdamW table onto the device (into the
  // planned buffer of `plan` in the optimizer phase at `optimizer`), and the host copies a
  // host-staged all-gather uses.
  absl::Status CheckShare(const std::vector<ParamRange>& ranges) const;
  absl::Status UploadShareTable(const std::vector<ParamRange>& ranges, const MemoryPlan& plan,
                                const StageBufferIds& ids, char* optimizer);
  absl::Status AllocateHostGather();

  // Forward's work, queued; the head's loss sum, queued for `loss_sum` (pinned).
  absl::Status LaunchForward(int slot, double* loss_sum);
  absl::Status LayerForward(const Slot& s, int64_t l, const T* x);
  absl::Status AttentionScores(const Slot& s, int64_t l);
  absl::Status AttentionForward(const Slot& s, int64_t l);
  // Without `norm_grads` (a full recomputation's redo of input gradients already made), the
  // fused LayerNorm backward's weight gradients go to discarded_norm_grads.
  absl::Status LayerBackwardInput(const Slot& s, int64_t l, const T* x, T* dx,
                                  bool norm_grads = true);
  absl::Status AttentionBackward(const Slot& s, int64_t l, const T* datty);
  absl::Status LayerBackwardWeight(const Slot& s, int64_t l, const T* x);
  // The Llama family's layer (cuda_stage_llama.cc): RMSNorm, q and k rotated in place in the
  // layer's qkv, grouped-query attention on the reference path, SwiGLU, no biases.
  absl::Status LlamaLayerForward(const Slot& s, int64_t l, const T* x);
  absl::Status LlamaLayerBackwardInput(const Slot& s, int64_t l, const T* x, T* dx);
  absl::Status LlamaLayerBackwardWeight(const Slot& s, int64_t l, const T* x);
  // Recomputation (cuda_stage_recompute.cc; the modes: StageBufferIds in device_memory_plan.h).
  // Full: the stage's blocks forward again for slot `s` into the shared buffers, and with
  // `input_grads` their input gradients from the slot's output gradient too (what W reads);
  // records the slot whose activations the shared buffers then hold.
  absl::Status RecomputeBlocks(int slot, bool input_grads);
  // Selective: layer l's MLP activation output made again in scratch_4c, the same bits as its
  // forward made (the GELU fused into the product's epilogue: the product again).
  absl::Status RecomputeActivation(const Slot& s, int64_t l);
  bool recompute(Recompute mode) const { return ids_.recompute == mode; }
  bool llama() const { return layout_.config.is_llama(); }
  // Key/value heads: grouped-query attention's (Llama), one per query head (GPT-2).
  int64_t KvHeads() const { return llama() ? layout_.config.n_kv_head : layout_.config.n_head; }
  // The head's stage sums a wte gradient of its own (head_wte_grad) into wte's.
  bool tied_head() const { return layout_.stage.has_head && TiedElements(layout_.config) > 0; }
  // The head's matrix: wte (tied) or an untied Llama head's kLmHead.
  T* HeadMatrix() const;
  // The final norm (LayerNorm or RMSNorm) of the stage's output into lnf; its backward into
  // `dout` (accumulating) and into the norm's weight gradients.
  absl::Status HeadNormForward(const Slot& s);
  absl::Status HeadNormBackwardInput(const Slot& s, T* dout);
  absl::Status HeadNormBackwardWeight(const Slot& s);
  // The head matrix's gradient += the slot's logits gradient^T · lnf: into head_wte_grad (tied;
  // folded into wte's by FoldHeadWteGrad) or an untied head's kLmHead gradient.
  absl::Status HeadWteGrad(const Slot& s);
  // The head's loss per row from the slot's logits (and, inside ForwardTraining with the fused
  // kernels, their gradient in the same pass); then the logits gradient in BackwardInput where
  // Forward did not make it (cuda_stage_classifier.cc).
  absl::Status ClassifierForward(int slot);
  absl::Status ClassifierBackward(int slot, float loss_scale);
  // runtime.kernels = auto: the fused classifier, the multi-tensor norm and AdamW, and weight
  // gradients written with beta = 0 by the first micro-batch after ZeroGrads.
  bool fused() const { return options_.kernels == KernelMode::kAuto; }
  // Zeroes what ZeroGrads left to the first weight products, where a call other than the
  // products is about to read or write it: every weight matrix's gradient once one overlaps
  // gradients [offset, offset + n) (weight_grads_deferred_), and the head's wte gradient when
  // `head` (head_grad_deferred_). A tied sum before any W then leaves the matrices to beta = 0.
  absl::Status ZeroDeferredGrads(bool head, int64_t offset, int64_t n);

  ParamLayout layout_;
  int64_t B_, T_;
  CudaStageOptions options_;
  MemoryPlan plan_;
  StageBufferIds ids_;
  int device_ = 0;
  LayerWidths widths_;           // StageLayerWidths(config)
  bool fuse_gelu_ = false;       // FuseGelu(options_.fuse_gelu, T is bf16)
  bool fused_kernels_ = false;   // UseFusedKernels(options_.kernels, B·T, C, sizeof(T))
  bool check_launches_ = false;  // FREERIDE_CUDA_CHECK_LAUNCHES
  bool head_grad_in_input_ = false;  // SetHeadGradInBackwardInput
  std::string description_;
  std::array<char*, kNumMemoryPhases> base_{};
  cudaStream_t stream_ = nullptr;
  cudaEvent_t messages_read_ = nullptr;  // recorded after each Upload
  cudaEvent_t grads_written_ = nullptr;  // GradsWritten's: a device sum's stream waits for it
  // Recorded after a Download into device memory (MessageWritten): the send waits for it.
  cudaEvent_t message_written_ = nullptr;
  bool message_written_on_device_ = false;
  int64_t message_device_bytes_ = 0;     // AllocateMessageBuffer's device memory so far
  std::function<void(int part)> weight_grad_progress_;  // SetWeightGradProgress
  BlasContext blas_;
  std::shared_ptr<LtAlgorithmCache> algorithms_ = MakeLtAlgorithmCache();
  float* host_grads_ = nullptr;  // pinned mirror of the gradients for host sums (HostGrads)
  // ZeRO-1: the share (ShardOptimizerState), its elements and AdamW table's chunks; whether
  // the chunk was made sharded and ShardOptimizerState is still to confirm it; and for the
  // host-staged all-gather (HostParams) the pinned fp32 copy of the parameters and, in bf16,
  // of the compute copy it is widened from.
  bool sharded_ = false, share_unconfirmed_ = false;
  std::vector<ParamRange> share_;
  int64_t share_elements_ = 0, share_chunks_ = 0;
  float* host_params_ = nullptr;
  uint16_t* host_compute_ = nullptr;
  std::vector<int64_t> distinct_tokens_;  // per slot, for the embedding backward
  CudaLedger ledger_;
  // Pinned: the loss sums ForwardKeepingLoss keeps (kKeptLosses), Forward's, then SlotStaging.
  static constexpr int kKeptLosses = 256;
  static constexpr int64_t kPinnedLossBytes = (kKeptLosses + 1) * sizeof(double);
  char* pinned_ = nullptr;
  int kept_count_ = 0;   // loss sums queued into pinned_ since the last fold
  double kept_sum_ = 0;  // the folded ones' mean losses, in order
  std::vector<cudaEvent_t> tokens_copied_, targets_copied_;  // per slot: its staging copied
  MultiTensorTable table_;                // the multi-tensor kernels' (also on the device)
  // Inside ForwardTraining: the loss scale its BackwardInput will pass, else NaN. Per slot: the
  // scale its logits gradient was made with in forward (the logits are gone), else NaN.
  float training_loss_scale_ = NAN;
  std::vector<float> logits_grad_scale_;
  // ZeroGrads left the weight matrices' gradients (the four per-layer products') and the
  // head's wte gradient unzeroed: the next products write them with beta = 0.
  bool weight_grads_deferred_ = false, head_grad_deferred_ = false;
  // Full recomputation: the slot whose block activations and input gradients the shared
  // buffers hold (its BackwardInput ran last, and no forward since), or -1.
  int recomputed_slot_ = -1;
};

}  // namespace freeride::cuda
