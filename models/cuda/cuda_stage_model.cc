#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/cuda_check.h"
#include "core/logging.h"
#include "core/status.h"
#include "models/cuda/cuda_stage.h"
#include "models/cuda/multi_tensor.h"
#include "models/gpt2.h"
#include "models/token_buckets.h"
#include "models/token_ids.h"

namespace freeride {
namespace cuda {
namespace {

// The tensors whose gradients only the weight products write (MatmulBackwardWeight).
bool IsWeightMatrix(ParamTensor t) {
  return t == ParamTensor::kQkvW || t == ParamTensor::kAttProjW || t == ParamTensor::kFcW ||
         t == ParamTensor::kFcProjW;
}

}  // namespace

template <typename T>
CudaStage<T>::CudaStage(const GPT2Config& config, const StageSpec& stage, int64_t micro_batch,
                        int64_t seq_len, int slots, const CudaStageOptions& options)
    : layout_(MakeParamLayout(config, stage)), B_(micro_batch), T_(seq_len), options_(options) {
  ids_ = PlanStageMemory(config, stage, B_, T_, slots, static_cast<int>(sizeof(T)), &plan_,
                         !options.inference_only, options.attention);
  fuse_gelu_ = FuseGelu(options.fuse_gelu, !std::is_same_v<T, float>);
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
  CUBLAS_CHECK(cublasLtCreate(&blas_.lt));
  CUBLAS_CHECK(cublasCreate(&blas_.blas));
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  FR_RETURN_IF_ERROR(CheckDeviceMemory(plan_.TotalBytes(), free_bytes, device_, plan_.Report()));
  for (int p = 0; p < kNumMemoryPhases; ++p) {
    const int64_t bytes = plan_.PhaseBytes(static_cast<MemoryPhase>(p));
    if (bytes > 0) CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&base_[p]), bytes));
  }
  if (!options_.inference_only) {
    CUDA_CHECK(
        cudaMallocHost(reinterpret_cast<void**>(&host_grads_), layout_.total * sizeof(float)));
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
  if (!options_.inference_only) {  // the multi-tensor table, once (table_ outlives the copy)
    char* table = Ptr<char>(ids_.multi_tensor_table);
    const int64_t chunks = static_cast<int64_t>(table_.chunks.size());
    CUDA_CHECK(cudaMemcpyAsync(table, table_.chunks.data(), chunks * sizeof(TensorChunk),
                               cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaMemcpyAsync(table + UnitBeginOffsetBytes(chunks), table_.unit_begin.data(),
                               table_.unit_begin.size() * 4, cudaMemcpyHostToDevice, stream_));
  }
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  description_ = absl::StrFormat(
      "cuda:%d %s %s%s%s%s%s", device_, prop.name, std::is_same_v<T, float> ? "fp32" : "bf16",
      fuse_gelu_ ? ", GELU fused" : "", ids_.flash_attention ? ", flash attention" : "",
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
absl::Status CudaStage<T>::Launched(const char* call, int64_t layer, absl::Status status) {
  if (status.ok()) {
    cudaError_t code = cudaGetLastError();
    if (code == cudaSuccess && check_launches_) code = cudaStreamSynchronize(stream_);
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
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::Upload(T* dst, const float* src, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
  } else {
    float* staging = Ptr<float>(ids_.staging);
    CUDA_CHECK(cudaMemcpyAsync(staging, src, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
    FR_KERNEL(kWholeChunk, Convert, dst, staging, n, stream_);
  }
  return Sync();
}

template <typename T>
absl::Status CudaStage<T>::Download(float* dst, const T* src, int64_t n) {
  const float* from = reinterpret_cast<const float*>(src);
  if constexpr (!std::is_same_v<T, float>) {
    float* staging = Ptr<float>(ids_.staging);
    FR_KERNEL(kWholeChunk, Convert, staging, src, n, stream_);
    from = staging;
  }
  CUDA_CHECK(cudaMemcpyAsync(dst, from, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  return Sync();
}

template <typename T>
absl::Status CudaStage<T>::SetTokens(int slot, const int32_t* tokens) {
  FR_RETURN_IF_ERROR(Enter());
  const Slot& s = ids_.slots[slot];
  const int64_t BT = B_ * T_;
  FR_RETURN_IF_ERROR(CheckTokenIds(tokens, BT, layout_.config.vocab_size, "tokens"));
  const TokenBuckets buckets = GroupPositionsByToken(tokens, BT, layout_.config.vocab_size);
  distinct_tokens_[slot] = static_cast<int64_t>(buckets.tokens.size());
  CUDA_CHECK(
      cudaMemcpyAsync(Ptr<int32_t>(s.tokens), tokens, BT * 4, cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaMemcpyAsync(Ptr<int32_t>(s.bucket_positions), buckets.positions.data(), BT * 4,
                             cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaMemcpyAsync(Ptr<int32_t>(s.bucket_tokens), buckets.tokens.data(),
                             buckets.tokens.size() * 4, cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaMemcpyAsync(Ptr<int32_t>(s.bucket_starts), buckets.starts.data(),
                             buckets.starts.size() * 4, cudaMemcpyHostToDevice, stream_));
  return Sync();  // the buckets die here
}

template <typename T>
absl::Status CudaStage<T>::SetTargets(int slot, const int32_t* targets) {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(CheckTokenIds(targets, B_ * T_, layout_.config.vocab_size, "targets"));
  CUDA_CHECK(cudaMemcpyAsync(Ptr<int32_t>(ids_.slots[slot].targets), targets, B_ * T_ * 4,
                             cudaMemcpyHostToDevice, stream_));
  return Sync();
}

template <typename T>
absl::Status CudaStage<T>::SetInputActivations(int slot, const float* x) {
  FR_RETURN_IF_ERROR(Enter());
  return Upload(Ptr<T>(ids_.slots[slot].input), x, B_ * T_ * layout_.config.n_embd);
}
template <typename T>
absl::Status CudaStage<T>::SetOutputGrad(int slot, const float* dy) {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("SetOutputGrad"));
  return Upload(OutputGrad(ids_.slots[slot]), dy, B_ * T_ * layout_.config.n_embd);
}
template <typename T>
absl::Status CudaStage<T>::GetOutputActivations(int slot, float* y) {
  FR_RETURN_IF_ERROR(Enter());
  return Download(y, OutputActivations(ids_.slots[slot]), B_ * T_ * layout_.config.n_embd);
}
template <typename T>
absl::Status CudaStage<T>::GetInputGrad(int slot, float* dx) {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("GetInputGrad"));
  return Download(dx, Ptr<T>(ids_.slots[slot].dinput), B_ * T_ * layout_.config.n_embd);
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
absl::Status CudaStage<T>::ZeroGrads() {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("ZeroGrads"));
  if (!fused()) {
    CUDA_CHECK(cudaMemsetAsync(Ptr<float>(ids_.grads), 0, layout_.total * 4, stream_));
    if (layout_.stage.has_head) {
      CUDA_CHECK(cudaMemsetAsync(Ptr<float>(ids_.head_wte_grad), 0,
                                 plan_.buffer(ids_.head_wte_grad).bytes, stream_));
    }
    return Sync();
  }
  // The weight matrices' gradients and the head's wte gradient are left to the first
  // products, which write them with beta = 0; the rest (accumulated by other kernels) is
  // zeroed here, in runs of adjacent tensors.
  int64_t begin = 0;
  for (const TensorSlot& slot : layout_.slots) {
    if (!slot.present || !IsWeightMatrix(slot.tensor)) continue;
    if (slot.offset > begin) {
      CUDA_CHECK(
          cudaMemsetAsync(Ptr<float>(ids_.grads) + begin, 0, (slot.offset - begin) * 4, stream_));
    }
    begin = slot.offset + slot.elements;
  }
  if (layout_.total > begin) {
    CUDA_CHECK(
        cudaMemsetAsync(Ptr<float>(ids_.grads) + begin, 0, (layout_.total - begin) * 4, stream_));
  }
  weight_grads_deferred_ = layout_.stage.num_layers() > 0;
  head_grad_deferred_ = layout_.stage.has_head;
  return Sync();
}

template <typename T>
absl::Status CudaStage<T>::ZeroDeferredGrads() {
  if (weight_grads_deferred_) {
    for (const TensorSlot& slot : layout_.slots) {
      if (!slot.present || !IsWeightMatrix(slot.tensor)) continue;
      CUDA_CHECK(
          cudaMemsetAsync(Ptr<float>(ids_.grads) + slot.offset, 0, slot.elements * 4, stream_));
    }
  }
  if (head_grad_deferred_) {
    CUDA_CHECK(cudaMemsetAsync(Ptr<float>(ids_.head_wte_grad), 0,
                               plan_.buffer(ids_.head_wte_grad).bytes, stream_));
  }
  weight_grads_deferred_ = head_grad_deferred_ = false;
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStage<T>::FoldHeadWteGrad() {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("FoldHeadWteGrad"));
  FR_RETURN_IF_ERROR(ZeroDeferredGrads());
  if (!layout_.stage.has_head) return absl::OkStatus();
  const int64_t n = layout_.config.padded_vocab_size * layout_.config.n_embd;
  if (layout_.stage.has_embedding) {
    FR_KERNEL(kHead, AddInPlace, G(ParamTensor::kWte), Ptr<float>(ids_.head_wte_grad), n, stream_);
  } else {
    FR_KERNEL(kHead, Copy, G(ParamTensor::kWte), Ptr<float>(ids_.head_wte_grad), n, stream_);
  }
  return Sync();
}

template <typename T>
absl::StatusOr<float*> CudaStage<T>::HostGrads(int64_t offset, int64_t n) {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("HostGrads"));
  FR_RETURN_IF_ERROR(ZeroDeferredGrads());
  CUDA_CHECK(cudaMemcpyAsync(host_grads_ + offset, Ptr<float>(ids_.grads) + offset, n * 4,
                             cudaMemcpyDeviceToHost, stream_));
  if (absl::Status s = Sync(); !s.ok()) return s;
  return host_grads_ + offset;
}

template <typename T>
absl::Status CudaStage<T>::CommitHostGrads(int64_t offset, int64_t n) {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("CommitHostGrads"));
  FR_RETURN_IF_ERROR(ZeroDeferredGrads());
  CUDA_CHECK(cudaMemcpyAsync(Ptr<float>(ids_.grads) + offset, host_grads_ + offset, n * 4,
                             cudaMemcpyHostToDevice, stream_));
  return Sync();
}

template <typename T>
absl::StatusOr<std::vector<double>> CudaStage<T>::GradSquaresByUnit() {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("GradSquaresByUnit"));
  FR_RETURN_IF_ERROR(ZeroDeferredGrads());
  const GPT2Config& cfg = layout_.config;
  const StageSpec& st = layout_.stage;
  double* partials = Ptr<double>(ids_.reduce_partials);
  double* units = partials + kReduceBlocks;
  int64_t u = 0;
  if (fused()) {  // one launch over every tensor, one combining each unit's partials
    const int64_t n = static_cast<int64_t>(table_.chunks.size());
    const char* table = Ptr<char>(ids_.multi_tensor_table);
    FR_KERNEL(kWholeChunk, MultiTensorGradSquares, units, Ptr<double>(ids_.multi_tensor_partials),
              Ptr<float>(ids_.grads), reinterpret_cast<const TensorChunk*>(table),
              reinterpret_cast<const int32_t*>(table + UnitBeginOffsetBytes(n)),
              table_.counted_chunks(), table_.units(), stream_);
    u = table_.units();
  }
  auto add = [&](int64_t layer, const float* x, int64_t n, bool first) -> absl::Status {
    FR_KERNEL(layer, SumOfSquares, units + u, x, n, !first, partials, stream_);
    return absl::OkStatus();
  };
  if (!fused() && st.has_embedding) {
    FR_RETURN_IF_ERROR(
        add(kEmbedding, G(ParamTensor::kWte), layout_.slot(ParamTensor::kWte).elements, true));
    FR_RETURN_IF_ERROR(
        add(kEmbedding, G(ParamTensor::kWpe), layout_.slot(ParamTensor::kWpe).elements, false));
    ++u;
  }
  for (int64_t l = 0; !fused() && l < st.num_layers(); ++l, ++u) {
    bool first = true;
    for (int i = 0; i < kNumParamTensors; ++i) {
      const ParamTensor t = static_cast<ParamTensor>(i);
      if (!IsPerLayer(t)) continue;
      FR_RETURN_IF_ERROR(add(l, G(t, l), ParamElements(cfg, t), first));
      first = false;
    }
  }
  if (!fused() && st.has_head) {
    FR_RETURN_IF_ERROR(add(kHead, G(ParamTensor::kLnfW), cfg.n_embd, true));
    FR_RETURN_IF_ERROR(add(kHead, G(ParamTensor::kLnfB), cfg.n_embd, false));
    ++u;
  }
  std::vector<double> out(u);
  CUDA_CHECK(
      cudaMemcpyAsync(out.data(), units, u * sizeof(double), cudaMemcpyDeviceToHost, stream_));
  if (absl::Status s = Sync(); !s.ok()) return s;
  return out;
}

template <typename T>
absl::Status CudaStage<T>::ApplyAdamW(const AdamWStep& step) {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("ApplyAdamW"));
  FR_RETURN_IF_ERROR(ZeroDeferredGrads());
  AdamWArgs a;
  a.lr = static_cast<float>(step.lr);
  a.beta1 = static_cast<float>(step.beta1);
  a.beta2 = static_cast<float>(step.beta2);
  a.eps = static_cast<float>(step.eps);
  a.grad_scale = static_cast<float>(step.grad_scale);
  a.bias_correction1 = static_cast<float>(1.0 - std::pow(step.beta1, double(step.step)));
  a.bias_correction2 = static_cast<float>(1.0 - std::pow(step.beta2, double(step.step)));
  if (fused()) {  // every tensor in one launch, the decay per chunk from the table
    a.weight_decay = static_cast<float>(step.weight_decay);
    bf16* compute = nullptr;
    if constexpr (!std::is_same_v<T, float>) compute = Ptr<bf16>(ids_.compute);
    FR_KERNEL(kWholeChunk, MultiTensorAdamW, Ptr<float>(ids_.master), compute,
              Ptr<float>(ids_.grads), Ptr<float>(ids_.adam_m), Ptr<float>(ids_.adam_v),
              Ptr<TensorChunk>(ids_.multi_tensor_table), static_cast<int64_t>(table_.chunks.size()),
              a, stream_);
    return Sync();
  }
  for (const TensorSlot& slot : layout_.slots) {
    if (!slot.present) continue;
    a.weight_decay = IsDecayed(slot.tensor) ? static_cast<float>(step.weight_decay) : 0.0f;
    bf16* compute = nullptr;
    if constexpr (!std::is_same_v<T, float>) compute = Ptr<bf16>(ids_.compute) + slot.offset;
    FR_KERNEL(kWholeChunk, AdamW, Ptr<float>(ids_.master) + slot.offset, compute,
              Ptr<float>(ids_.grads) + slot.offset, Ptr<float>(ids_.adam_m) + slot.offset,
              Ptr<float>(ids_.adam_v) + slot.offset, slot.elements, a, stream_);
  }
  return Sync();
}

template <typename T>
absl::Status CudaStage<T>::GetParams(float* dst) {
  FR_RETURN_IF_ERROR(Enter());
  CUDA_CHECK(cudaMemcpyAsync(dst, Ptr<float>(ids_.master), layout_.total * 4,
                             cudaMemcpyDeviceToHost, stream_));
  return Sync();
}

template <typename T>
absl::Status CudaStage<T>::SetParams(const float* src) {
  FR_RETURN_IF_ERROR(Enter());
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
  CUDA_CHECK(cudaMemcpyAsync(m, Ptr<float>(ids_.adam_m), layout_.total * 4, cudaMemcpyDeviceToHost,
                             stream_));
  CUDA_CHECK(cudaMemcpyAsync(v, Ptr<float>(ids_.adam_v), layout_.total * 4, cudaMemcpyDeviceToHost,
                             stream_));
  return Sync();
}

template <typename T>
absl::Status CudaStage<T>::SetOptimizerState(const float* m, const float* v) {
  FR_RETURN_IF_ERROR(Enter());
  FR_RETURN_IF_ERROR(RequireTraining("SetOptimizerState"));
  CUDA_CHECK(cudaMemcpyAsync(Ptr<float>(ids_.adam_m), m, layout_.total * 4, cudaMemcpyHostToDevice,
                             stream_));
  CUDA_CHECK(cudaMemcpyAsync(Ptr<float>(ids_.adam_v), v, layout_.total * 4, cudaMemcpyHostToDevice,
                             stream_));
  return Sync();
}

template <typename T>
absl::Status CudaStage<T>::InitRandom(uint64_t seed) {
  std::vector<float> params(layout_.total);
  InitGPT2Params(layout_, seed, params.data());
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
