// The fused classifier behind classifier.h: one block per row, 128-bit loads, fp32 online
// softmax (classifier_math.h) merged by warp shuffles then across warps. The gradient pass
// reads the row again right after its statistics, while the row (≤ 100 KiB) is still in L2,
// so HBM sees the logits once.
#include <cuda_bf16.h>

#include <cstring>

#include "models/cuda/classifier.h"
#include "models/cuda/classifier_math.h"
#include "models/cuda/launch.h"

namespace freeride::cuda {
namespace {

using bf16 = __nv_bfloat16;
using classifier::OnlineSoftmax;

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void FromFloat(float x, float* out) { *out = x; }
__device__ __forceinline__ void FromFloat(float x, bf16* out) { *out = __float2bfloat16_rn(x); }

// Every lane of the warp ends with the state over all 32 lanes' (Merge is symmetric).
__device__ __forceinline__ OnlineSoftmax WarpMerge(OnlineSoftmax s) {
  for (int o = 16; o > 0; o >>= 1) {
    const OnlineSoftmax other{__shfl_xor_sync(0xffffffffu, s.max, o),
                              __shfl_xor_sync(0xffffffffu, s.sum, o)};
    s = classifier::Merge(s, other);
  }
  return s;
}

template <typename T>
__global__ void __launch_bounds__(classifier::kThreads)
    FusedClassifierKernel(float* losses, float* logsumexp, T* logits, const int32_t* targets,
                          float grad_scale, bool write_grad, int V, int Vp) {
  constexpr int W = static_cast<int>(classifier::VectorWidth(sizeof(T)));
  constexpr int kWarps = classifier::kThreads / 32;
  static_assert(W * sizeof(T) == sizeof(int4), "a vector is one int4");
  __shared__ float warp_max[kWarps], warp_sum[kWarps];
  __shared__ float row_lse;
  const int64_t row = blockIdx.x;
  int4* x = reinterpret_cast<int4*>(logits + row * Vp);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // The int4's bytes move to and from T e[W] by memcpy (a register move), not through a T*
  // into the int4, which breaks strict aliasing (g++ -O2 miscompiles it in the emulation build).
  auto load = [x](int vec, float* out) {
    const int4 raw = x[vec];
    T e[W];
    std::memcpy(e, &raw, sizeof raw);
#pragma unroll
    for (int k = 0; k < W; ++k) out[k] = ToFloat(e[k]);
  };
  OnlineSoftmax s = WarpMerge(classifier::ThreadShare<W>(load, threadIdx.x, blockDim.x, V, Vp));
  if (lane == 0) {
    warp_max[warp] = s.max;
    warp_sum[warp] = s.sum;
  }
  __syncthreads();
  const int32_t target = targets[row];
  if (warp == 0) {
    OnlineSoftmax w;
    if (lane < kWarps) w = {warp_max[lane], warp_sum[lane]};
    w = WarpMerge(w);
    if (lane == 0) {
      const float lse = classifier::LogSumExp(w);
      row_lse = lse;
      logsumexp[row] = lse;
      // Read before the barrier below, after which the row is overwritten.
      losses[row] = classifier::Loss(lse, ToFloat(logits[row * Vp + target]));
    }
  }
  __syncthreads();
  if (!write_grad) return;
  const float lse = row_lse;
  for (int vec = threadIdx.x; vec * W < Vp; vec += blockDim.x) {
    float values[W];
    load(vec, values);
    T e[W];
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const int v = vec * W + k;
      FromFloat(classifier::Gradient(values[k], lse, v == target, v >= V, grad_scale), &e[k]);
    }
    int4 raw;
    std::memcpy(&raw, e, sizeof raw);
    x[vec] = raw;
  }
}

}  // namespace

template <typename T>
void FusedClassifier(float* losses, float* logsumexp, T* logits, const int32_t* targets,
                     float grad_scale, bool write_grad, int64_t N, int64_t V, int64_t Vp,
                     cudaStream_t stream) {
  FR_LAUNCH(static_cast<unsigned>(N), classifier::kThreads, 0, stream, FusedClassifierKernel<T>)(
      losses, logsumexp, logits, targets, grad_scale, write_grad, static_cast<int>(V),
      static_cast<int>(Vp));
}

template void FusedClassifier<float>(float*, float*, float*, const int32_t*, float, bool, int64_t,
                                     int64_t, int64_t, cudaStream_t);
template void FusedClassifier<bf16>(float*, float*, bf16*, const int32_t*, float, bool, int64_t,
                                    int64_t, int64_t, cudaStream_t);

}  // namespace freeride::cuda
