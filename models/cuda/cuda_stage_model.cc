#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/cuda_check.h"
#include "core/host_memory.h"
#include "core/logging.h"
#include "core/status.h"
#include "models/cpu/llama_kernels.h"
#include "models/cuda/cuda_stage.h"
#include "models/cuda/multi_tensor.h"
#include "models/gpt2.h"
#include "models/llama.h"
#include "models/stage_message.h"
#include "models/token_buckets.h"
#include "models/token_ids.h"

namespace freeride {
namespace cuda {
template <typename T>
CudaStage<T>::CudaStage(const GPT2Config& config, const StageSpec& stage, int64_t micro_batch,
                        int64_t seq_len, int slots, const CudaStageOptions& options)
    : layout_(MakeParamLayout(config, stage)), B_(micro_batch), T_(seq_len), options_(options) {
  // ZeRO-1 made sharded: the share's optimizer state planned from the start (Init checks the
  // ranges before anything is allocated).
  OptimizerShare share;
  if (options.zero_share && !options.inference_only) {
    share.elements = 0;
    for (const ParamRange& r : *options.zero_share) share.elements += r.n;
    share.table_chunks = ShareTableChunks(*options.zero_share);
  }
  ids_ = PlanStageMemory(config, stage, B_, T_, slots, static_cast<int>(sizeof(T)), &plan_,
                         !options.inference_only, options.attention, options.recompute, share);
  widths_ = StageLayerWidths(config);
  fuse_gelu_ = !config.is_llama() && FuseGelu(options.fuse_gelu, !std::is_same_v<T, float>);
  fused_kernels_ = UseFusedKernels(options.kernels, B_ * T_, config.n_embd, sizeof(T));
  distinct_tokens_.assign(slots, 0);
  logits_grad_scale_.assign(slots, NAN);
  if (!options.inference_only) table_ = MakeMultiTensorTable(layout_);
}

template <typename T>
CudaStage<T>::~CudaStage() {
  // Teardown cannot report errors; each release is attempted whatever the one before did.
  cudaSetDevice(device_);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (blas_.blas != nullptr) cublasDestroy(blas_.blas);
  if (blas_.lt != nullptr) cublasLtDestroy(blas_.lt);
  for (char* base : base_) {
    if (base != nullptr) cudaFree(base);
  }
  if (host_grads_ != nullptr) cudaFreeHost(host_grads_);
  if (host_params_ != nullptr) cudaFreeHost(host_params_);
  if (host_compute_ != nullptr) cudaFreeHost(host_compute_);
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
  for (auto* events : {&tokens_copied_, &targets_copied_}) {
    for (cudaEvent_t e : *events) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }
  if (messages_read_ != nullptr) cudaEventDestroy(messages_read_);
  if (grads_written_ != nullptr) cudaEventDestroy(grads_written_);
  if (message_written_ != nullptr) cudaEventDestroy(message_written_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

template <typename T>
absl::Status CudaStage<T>::Init() {
  int count = 0;
  CUDA_CHECK(cudaGetDeviceCount(&count));
  if (count == 0) return absl::FailedPreconditionError("no CUDA device is visible");
  device_ = options_.device_index % count;
  absl::StatusOr<bool> check_launches = CheckLaunchesFromEnvironment();
  if (!check_launches.ok()) return check_launches.status();
  check_launches_ = *check_launches;
  CUDA_CHECK(cudaSetDevice(device_));
  // The stream and library handles first, so that the free memory checked below is what is
  // left after the context and them (measured, not estimated).
  // The default priority is already the lowest: training takes the highest, so that side
  // work (the lowest) is what yields when both have kernels waiting.
  int least_priority = 0, greatest_priority = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least_priority, &greatest_priority));
  CUDA_CHECK(cudaStreamCreateWithPriority(
      &stream_, cudaStreamNonBlocking, options_.low_priority ? least_priority : greatest_priority));
  CUDA_CHECK(cudaEventCreateWithFlags(&messages_read_, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&grads_written_, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&message_written_, cudaEventDisableTiming));
  CUBLAS_CHECK(cublasLtCreate(&blas_.lt));
  CUBLAS_CHECK(cublasCreate(&blas_.blas));
  if (ids_.flash_attention) {
    int optin = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_));
    FR_RETURN_IF_ERROR(CheckFlashSharedMemory(
        layout_.config.n_embd / layout_.config.n_head, optin, device_));
  }
  const bool zero = options_.zero_share && !options_.inference_only;
  if (zero) FR_RETURN_IF_ERROR(CheckShare(*options_.zero_share));
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  // The device messages the executor allocates before the first step count too: refused here,
  // not at the first step.
  const int64_t message_bytes = options_.device_messages * MessageBytes();
  std::string report = plan_.Report();
  if (message_bytes > 0) {
    absl::StrAppend(&report, "; ", options_.device_messages, " device messages ",
                    FormatBytes(message_bytes));
  }
  FR_RETURN_IF_ERROR(
      CheckDeviceMemory(plan_.TotalBytes() + message_bytes, free_bytes, device_, report));
  for (int p = 0; p < kNumMemoryPhases; ++p) {
    const int64_t bytes = plan_.PhaseBytes(static_cast<MemoryPhase>(p));
    if (bytes > 0) FR_RETURN_IF_ERROR(DeviceAlloc(&base_[p], bytes));
  }
  if (!options_.inference_only) {
    char* host_grads = nullptr;
    FR_RETURN_IF_ERROR(PinnedAlloc(&host_grads, layout_.total * sizeof(float)));
    host_grads_ = reinterpret_cast<float*>(host_grads);
  }
  FR_RETURN_IF_ERROR(
      PinnedAlloc(&pinned_, kPinnedLossBytes + slots() * (5 * B_ * T_ + 1) * sizeof(int32_t)));
  tokens_copied_.assign(slots(), nullptr);
  targets_copied_.assign(slots(), nullptr);
  for (auto* events : {&tokens_copied_, &targets_copied_}) {
    for (cudaEvent_t& e : *events) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  blas_.workspace = Ptr<char>(ids_.cublaslt_workspace);
  blas_.workspace_bytes = kCublasLtWorkspaceBytes;
  blas_.stream = stream_;
  blas_.algorithms = algorithms_.get();
  // cuBLAS gets the same fixed workspace: no allocation inside a step, the same algorithms.
  // The stream first: cublasSetStream puts the handle back on cuBLAS's own workspace pool, so
  // it is set once, here, and never per call.
  CUBLAS_CHECK(cublasSetStream(blas_.blas, stream_));
  CUBLAS_CHECK(cublasSetWorkspace(blas_.blas, blas_.workspace, blas_.workspace_bytes));
  for (MemoryPhase phase : {MemoryPhase::kGradients, MemoryPhase::kOptimizer}) {
    if (plan_.PhaseBytes(phase) == 0) continue;  // inference only
    CUDA_CHECK(
        cudaMemsetAsync(base_[static_cast<int>(phase)], 0, plan_.PhaseBytes(phase), stream_));
  }
  if (layout_.config.is_llama()) {  // the rotary tables, as the CPU's (computed in double)
    std::vector<float> cos, sin;
    cpu::RopeTables(&cos, &sin, T_, layout_.config.head_size(), layout_.config.rope_theta);
    CUDA_CHECK(cudaMemcpy(Ptr<float>(ids_.rope_cos), cos.data(), cos.size() * sizeof(float),
                          cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(Ptr<float>(ids_.rope_sin), sin.data(), sin.size() * sizeof(float),
                          cudaMemcpyHostToDevice));
  }
  if (!options_.inference_only) {  // the multi-tensor table, once (table_ outlives the copy)
    char* table = Ptr<char>(ids_.multi_tensor_table);
    const int64_t chunks = static_cast<int64_t>(table_.chunks.size());
    CUDA_CHECK(cudaMemcpyAsync(table, table_.chunks.data(), chunks * sizeof(TensorChunk),
                               cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaMemcpyAsync(table + UnitBeginOffsetBytes(chunks), table_.unit_begin.data(),
                               table_.unit_begin.size() * 4, cudaMemcpyHostToDevice, stream_));
  }
  if (zero) {
    share_ = *options_.zero_share;
    FR_RETURN_IF_ERROR(
        UploadShareTable(share_, plan_, ids_, base_[static_cast<int>(MemoryPhase::kOptimizer)]));
    if (options_.zero_host_gather) FR_RETURN_IF_ERROR(AllocateHostGather());
    sharded_ = true;
    share_unconfirmed_ = true;
  }
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  description_ = absl::StrFormat(
      "cuda:%d %s %s%s%s%s%s%s%s%s", device_, prop.name, std::is_same_v<T, float> ? "fp32" : "bf16",
      layout_.config.is_llama() ? " llama" : "", fuse_gelu_ ? ", GELU fused" : "",
      ids_.flash_attention ? ", flash attention" : "", fused_kernels_ ? ", fused kernels" : "",
      recompute(Recompute::kNone) ? ""
                                  : absl::StrCat(", recompute ", RecomputeName(ids_.recompute)),
      check_launches_ ? ", every launch checked" : "",
      options_.inference_only ? " (inference)" : "");
  FR_LOG(INFO) << description_ << ": layers [" << layout_.stage.first_layer << ", "
               << layout_.stage.last_layer << "), micro-batch " << B_ << " × " << T_ << ", "
               << slots() << " slots; device memory: " << plan_.Report();
  return Sync();
}

template <typename T>
T* CudaStage<T>::P(ParamTensor t, int64_t l) const {
  const int64_t offset = layout_.slot(t).offset + l * ParamElements(layout_.config, t);
  if constexpr (std::is_same_v<T, float>) {
    return Ptr<float>(ids_.master) + offset;
  } else {
    return Ptr<T>(ids_.compute) + offset;
  }
}

template <typename T>
float* CudaStage<T>::G(ParamTensor t, int64_t l) const {
  return Ptr<float>(ids_.grads) + layout_.slot(t).offset + l * ParamElements(layout_.config, t);
}

template <typename T>
absl::Status CudaStage<T>::RequireTraining(const char* what) const {
  if (!options_.inference_only) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrFormat("%s on %s: the chunk was made for inference only", what, description_));
}

template <typename T>
absl::Status CudaStage<T>::Enter() {
  CUDA_CHECK(cudaSetDevice(device_));
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::DeviceAlloc(char** ptr, int64_t bytes) {
  ++ledger_.allocations;
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(ptr), bytes));
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::PinnedAlloc(char** ptr, int64_t bytes) {
  ++ledger_.allocations;
  CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(ptr), bytes));
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::Launched(const char* call, int64_t layer, absl::Status status) {
  ++ledger_.launches;
  if (status.ok()) {
    cudaError_t code = cudaGetLastError();
    if (code == cudaSuccess && check_launches_) {
      ++ledger_.syncs;
      code = cudaStreamSynchronize(stream_);
    }
    if (code != cudaSuccess) {
      status = CudaStatus(code, check_launches_ ? "launch, then cudaStreamSynchronize" : "launch",
                          __FILE__, __LINE__);
    }
  }
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(LaunchSite(call, layer, layout_.stage.first_layer), " on ",
                                   description_, ": ", status.message()));
}

template <typename T>
absl::Status CudaStage<T>::Sync() {
  CUDA_CHECK(cudaGetLastError());
  ++ledger_.syncs;
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::Drain() {
  FR_RETURN_IF_ERROR(Enter());
  return Sync();
}

template <typename T>
absl::Status CudaStage<T>::AwaitStaging(cudaEvent_t copied) {
  cudaError_t code = cudaEventQuery(copied);
  if (code == cudaErrorNotReady) {
    // Not an error, but it must not read as the next launch's.
    if (cudaPeekAtLastError() == cudaErrorNotReady) cudaGetLastError();
    ++ledger_.syncs;
    code = cudaEventSynchronize(copied);
  }
  CUDA_CHECK(code);
  return absl::OkStatus();
}

// cudaMemcpyDefault: a message is pinned host memory or, for a transport that carries device
// memory, device memory (AllocateMessageBuffer); unified addressing tells which.
template <typename T>
absl::Status CudaStage<T>::Upload(T* dst, const void* src, int64_t n) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDefault, stream_));
  CUDA_CHECK(cudaEventRecord(messages_read_, stream_));
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::Download(void* dst, const T* src, int64_t n) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDefault, stream_));
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, dst) != cudaSuccess) {
    cudaGetLastError();  // host memory unknown to CUDA: not an error here
    attributes.type = cudaMemoryTypeUnregistered;
  }
  message_written_on_device_ = attributes.type == cudaMemoryTypeDevice;
  // Device memory: the transport's stream reads it after message_written_ (MessageWritten),
  // no host wait. Host memory: the transport reads it from the host next.
  if (!message_written_on_device_) return Sync();
  CUDA_CHECK(cudaEventRecord(message_written_, stream_));
  return absl::OkStatus();
}

namespace {
void FreePinned(void* p) { cudaFreeHost(p); }
// Freed with its own device current: the executor may let go of a message on a thread whose
// current device is another.
void FreeDevice(void* p) {
  cudaPointerAttributes attributes{};
  int current = 0;
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess ||
      cudaGetDevice(&current) != cudaSuccess || attributes.device == current) {
    cudaFree(p);
    return;
  }
  cudaSetDevice(attributes.device);
  cudaFree(p);
  cudaSetDevice(current);
}
}  // namespace

template <typename T>
absl::StatusOr<MessageBuffer> CudaStage<T>::AllocateMessageBuffer(MessageMemory memory) {
  FR_RETURN_IF_ERROR(Enter());
  char* p = nullptr;
  if (memory == MessageMemory::kHost) {
    FR_RETURN_IF_ERROR(PinnedAlloc(&p, MessageBytes()));
    return MessageBuffer(p, FreePinned);
  }
  if (absl::Status s = DeviceAlloc(&p, MessageBytes()); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("a message buffer of ", MessageBytes(), " bytes on ",
                                               description_, ": ", s.message()));
  }
  message_device_bytes_ += MessageBytes();
  return MessageBuffer(p, FreeDevice);
}

template <typename T>
absl::Status CudaStage<T>::FinishMessageReads() {
  FR_RETURN_IF_ERROR(Enter());
  return AwaitStaging(messages_read_);
}

template <typename T>
absl::Status CudaStage<T>::SetTokens(int slot, const int32_t* tokens) {
  FR_RETURN_IF_ERROR(Enter());
  const Slot& s = ids_.slots[slot];
  const int64_t BT = B_ * T_;
  FR_RETURN_IF_ERROR(CheckTokenIds(tokens, BT, layout_.config.vocab_size, "tokens"));
  const TokenBuckets buckets = GroupPositionsByToken(tokens, BT, layout_.config.vocab_size);
  // Copied from pinned staging: no wait for the copies, and the caller's buffer (and the
  // buckets) may go at once.
  FR_RETURN_IF_ERROR(AwaitStaging(tokens_copied_[slot]));
  int32_t* staged = SlotStaging(slot);
  int32_t* positions = staged + BT;
  int32_t* distinct = staged + 2 * BT;
  int32_t* starts = staged + 3 * BT;
  std::memcpy(staged, tokens, BT * 4);
  std::memcpy(positions, buckets.positions.data(), BT * 4);
  std::memcpy(distinct, buckets.tokens.data(), buckets.tokens.size() * 4);
  std::memcpy(starts, buckets.starts.data(), buckets.starts.size() * 4);
  distinct_tokens_[slot] = static_cast<int64_t>(buckets.tokens.size());
  CUDA_CHECK(
      cudaMemcpyAsync(Ptr<int32_t>(s.tokens), staged, BT * 4, cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaMemcpyAsync(Ptr<int32_t>(s.bucket_positions), positions, BT * 4,
                             cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaMemcpyAsync(Ptr<int32_t>(s.bucket_tokens), distinct, buckets.tokens.size() * 4,
                             cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaMemcpyAsync(Ptr<int32_t>(s.bucket_starts), starts, buckets.starts.size() * 4,
                             cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaEventRecord(tokens_copied_[slot], stream_));
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::SetTargets(int slot, const int32_t* targets) {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(CheckTokenIds(targets, B_ * T_, layout_.config.vocab_size, "targets"));
  FR_RETURN_IF_ERROR(AwaitStaging(targets_copied_[slot]));
  int32_t* staged = SlotStaging(slot) + 4 * B_ * T_ + 1;
  std::memcpy(staged, targets, B_ * T_ * 4);
  CUDA_CHECK(cudaMemcpyAsync(Ptr<int32_t>(ids_.slots[slot].targets), staged, B_ * T_ * 4,
                             cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaEventRecord(targets_copied_[slot], stream_));
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::SetInputActivations(int slot, const void* x) {
  FR_RETURN_IF_ERROR(Enter());
  return Upload(Ptr<T>(ids_.slots[slot].input), x, MessageElements());
}
template <typename T>
absl::Status CudaStage<T>::SetOutputGrad(int slot, const void* dy) {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("SetOutputGrad"));
  return Upload(OutputGrad(ids_.slots[slot]), dy, MessageElements());
}
template <typename T>
absl::Status CudaStage<T>::GetOutputActivations(int slot, void* y) {
  FR_RETURN_IF_ERROR(Enter());
  return Download(y, OutputActivations(ids_.slots[slot]), MessageElements());
}
template <typename T>
absl::Status CudaStage<T>::GetInputGrad(int slot, void* dx) {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("GetInputGrad"));
  return Download(dx, Ptr<T>(ids_.slots[slot].dinput), MessageElements());
}
template <typename T>
absl::Status CudaStage<T>::GetLosses(int slot, float* losses) {
  FR_RETURN_IF_ERROR(Enter());
  CUDA_CHECK(cudaMemcpyAsync(losses, Ptr<float>(ids_.slots[slot].losses), B_ * T_ * 4,
                             cudaMemcpyDeviceToHost, stream_));
  return Sync();
}

template <typename T>
absl::Status CudaStage<T>::GetLogitsAt(int slot, int64_t position, float* logits) {
  FR_RETURN_IF_ERROR(Enter());
  if (!std::isnan(logits_grad_scale_[slot])) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "GetLogitsAt of slot %d on %s: ForwardTraining made its logits their gradient", slot,
        description_));
  }
  // One row per sequence, T_ rows apart: a strided copy of B rows, widened on the host.
  const int64_t Vp = layout_.config.padded_vocab_size;
  std::vector<T> rows(B_ * Vp);
  CUDA_CHECK(cudaMemcpy2DAsync(rows.data(), Vp * sizeof(T),
                               Ptr<T>(ids_.slots[slot].logits) + position * Vp, T_ * Vp * sizeof(T),
                               Vp * sizeof(T), B_, cudaMemcpyDeviceToHost, stream_));
  FR_RETURN_IF_ERROR(Sync());
  for (int64_t i = 0; i < B_ * Vp; ++i) logits[i] = static_cast<float>(rows[i]);
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<double> CudaStage<T>::Forward(int slot) {
  FR_RETURN_IF_ERROR(Enter());
  if (!layout_.stage.has_head) {
    FR_RETURN_IF_ERROR(LaunchForward(slot, nullptr));
    return 0.0;
  }
  double* loss_sum = reinterpret_cast<double*>(pinned_) + kKeptLosses;
  FR_RETURN_IF_ERROR(LaunchForward(slot, loss_sum));
  FR_RETURN_IF_ERROR(Sync());
  return *loss_sum / static_cast<double>(B_ * T_);
}

template <typename T>
absl::Status CudaStage<T>::ForwardKeepingLoss(int slot, std::optional<float> backward_loss_scale) {
  FR_RETURN_IF_ERROR(Enter());
  if (backward_loss_scale) FR_RETURN_IF_ERROR(RequireTraining("ForwardKeepingLoss"));
  if (layout_.stage.has_head && kept_count_ == kKeptLosses) {
    FR_RETURN_IF_ERROR(FoldKeptLosses());
  }
  // As in ForwardTraining: the fused classifier makes the logits gradient at this scale.
  training_loss_scale_ = backward_loss_scale.value_or(NAN);
  absl::Status s = LaunchForward(
      slot, layout_.stage.has_head ? reinterpret_cast<double*>(pinned_) + kept_count_ : nullptr);
  training_loss_scale_ = NAN;
  if (s.ok() && layout_.stage.has_head) ++kept_count_;
  return s;
}

template <typename T>
absl::Status CudaStage<T>::FoldKeptLosses() {
  if (kept_count_ == 0) return absl::OkStatus();
  FR_RETURN_IF_ERROR(Sync());
  // Each mean as Forward returns it, added in order: the sum a caller of Forward makes.
  const double* sums = reinterpret_cast<const double*>(pinned_);
  for (int i = 0; i < kept_count_; ++i) kept_sum_ += sums[i] / static_cast<double>(B_ * T_);
  kept_count_ = 0;
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<double> CudaStage<T>::TakeLosses() {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(FoldKeptLosses());
  return std::exchange(kept_sum_, 0.0);
}

template <typename T>
absl::Status CudaStage<T>::GetParams(float* dst) {
  FR_RETURN_IF_ERROR(Enter());
  if (ids_.master_sharded) {  // the compute copy widened, the share's master over it
    std::vector<uint16_t> bits(layout_.total);
    CUDA_CHECK(cudaMemcpyAsync(bits.data(), Ptr<bf16>(ids_.compute), layout_.total * 2,
                               cudaMemcpyDeviceToHost, stream_));
    FR_RETURN_IF_ERROR(Sync());
    for (int64_t i = 0; i < layout_.total; ++i) dst[i] = FloatOfBf16(bits[i]);
    int64_t packed = 0;
    for (const ParamRange& r : share_) {
      CUDA_CHECK(cudaMemcpyAsync(dst + r.offset, Ptr<float>(ids_.master) + packed, r.n * 4,
                                 cudaMemcpyDeviceToHost, stream_));
      packed += r.n;
    }
    return Sync();
  }
  CUDA_CHECK(cudaMemcpyAsync(dst, Ptr<float>(ids_.master), layout_.total * 4,
                             cudaMemcpyDeviceToHost, stream_));
  return Sync();
}

template <typename T>
absl::Status CudaStage<T>::SetParams(const float* src) {
  FR_RETURN_IF_ERROR(Enter());
  if (ids_.master_sharded) {  // the share's master; the compute copy rounded as Convert rounds
    std::vector<uint16_t> bits(layout_.total);
    for (int64_t i = 0; i < layout_.total; ++i) bits[i] = Bf16Bits(src[i]);
    CUDA_CHECK(cudaMemcpyAsync(Ptr<bf16>(ids_.compute), bits.data(), layout_.total * 2,
                               cudaMemcpyHostToDevice, stream_));
    int64_t packed = 0;
    for (const ParamRange& r : share_) {
      CUDA_CHECK(cudaMemcpyAsync(Ptr<float>(ids_.master) + packed, src + r.offset, r.n * 4,
                                 cudaMemcpyHostToDevice, stream_));
      packed += r.n;
    }
    return Sync();  // before `bits` goes
  }
  CUDA_CHECK(cudaMemcpyAsync(Ptr<float>(ids_.master), src, layout_.total * 4,
                             cudaMemcpyHostToDevice, stream_));
  if constexpr (!std::is_same_v<T, float>) {
    FR_KERNEL(kWholeChunk, Convert, Ptr<bf16>(ids_.compute), Ptr<float>(ids_.master), layout_.total,
              stream_);
  }
  return Sync();
}

template <typename T>
absl::Status CudaStage<T>::GetOptimizerState(float* m, float* v) {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("GetOptimizerState"));
  CUDA_CHECK(cudaMemcpyAsync(m, Ptr<float>(ids_.adam_m), OptimizerStateElements() * 4,
                             cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaMemcpyAsync(v, Ptr<float>(ids_.adam_v), OptimizerStateElements() * 4,
                             cudaMemcpyDeviceToHost, stream_));
  return Sync();
}

template <typename T>
absl::Status CudaStage<T>::SetOptimizerState(const float* m, const float* v) {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("SetOptimizerState"));
  CUDA_CHECK(cudaMemcpyAsync(Ptr<float>(ids_.adam_m), m, OptimizerStateElements() * 4,
                             cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaMemcpyAsync(Ptr<float>(ids_.adam_v), v, OptimizerStateElements() * 4,
                             cudaMemcpyHostToDevice, stream_));
  return Sync();
}

template <typename T>
absl::Status CudaStage<T>::InitRandom(uint64_t seed) {
  std::vector<float> params(layout_.total);
  if (layout_.config.is_llama()) {
    InitLlamaParams(layout_, seed, params.data());
  } else {
    InitGPT2Params(layout_, seed, params.data());
  }
  return SetParams(params.data());
}

template class CudaStage<float>;
template class CudaStage<bf16>;

}  // namespace cuda

absl::StatusOr<std::unique_ptr<CudaStageModel>> CudaStageModel::Create(
    const GPT2Config& config, const StageSpec& stage, int64_t micro_batch, int64_t seq_len,
    int slots, const CudaStageOptions& options) {
  if (config.n_embd % config.n_head != 0) {
    return absl::InvalidArgumentError("n_embd must be a multiple of n_head");
  }
  std::unique_ptr<CudaStageModel> model;
  absl::Status s;
  if (options.precision == CudaPrecision::kBf16) {
    auto m = std::make_unique<cuda::CudaStage<cuda::bf16>>(config, stage, micro_batch, seq_len,
                                                           slots, options);
    s = m->Init();
    model = std::move(m);
  } else {
    auto m = std::make_unique<cuda::CudaStage<float>>(config, stage, micro_batch, seq_len, slots,
                                                      options);
    s = m->Init();
    model = std::move(m);
  }
  if (!s.ok()) return s;
  return model;
}

}  // namespace freeride
