// The fused LayerNorm kernels of layernorm.h. Both walk a row one warp at a time, lane `lane`
// owning the 16-byte vectors at vec::LaneColumn(lane, k, width).
#include <cuda_bf16.h>

#include "models/cuda/column_sums.h"
#include "models/cuda/launch.h"
#include "models/cuda/layernorm.h"
#include "models/cuda/vector_access.cuh"

namespace freeride::cuda {
namespace {

using vec::FromFloat;
using vec::Load;
using vec::Store;
using vec::ToFloat;
using vec::Vector;
using vec::WarpSum;

constexpr float kEpsilon = 1e-5f;

// One warp per row, the row kept in registers between the mean, the variance and the output:
// each element is read once (a and b) and written once (residual and out).
template <typename T>
__global__ void __launch_bounds__(vec::kForwardWarps * 32)
    ResidualLayerNormForwardKernel(T* residual, T* out, float* mean, float* rstd, const T* a,
                                   const T* b, const T* weight, const T* bias, int32_t N,
                                   int32_t C) {
  constexpr int W = Vector<T>::kWidth;
  const int32_t row = blockIdx.x * vec::kForwardWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const int32_t base = row * C;
  Vector<T> x[vec::kMaxVectorsPerLane];
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < vec::kMaxVectorsPerLane; ++k) {
    const int32_t c = vec::LaneColumn(lane, k, W);
    if (c < C) {
      x[k] = Load(a + base + c);
      if (b != nullptr) {
        const Vector<T> y = Load(b + base + c);
#pragma unroll
        for (int i = 0; i < W; ++i) x[k].v[i] = FromFloat<T>(ToFloat(x[k].v[i]) + ToFloat(y.v[i]));
        Store(residual + base + c, x[k]);
      }
#pragma unroll
      for (int i = 0; i < W; ++i) sum += ToFloat(x[k].v[i]);
    }
  }
  const float m = WarpSum(sum) / C;
  float var = 0.0f;
#pragma unroll
  for (int k = 0; k < vec::kMaxVectorsPerLane; ++k) {
    if (vec::LaneColumn(lane, k, W) < C) {
#pragma unroll
      for (int i = 0; i < W; ++i) {
        const float d = ToFloat(x[k].v[i]) - m;
        var += d * d;
      }
    }
  }
  const float s = rsqrtf(WarpSum(var) / C + kEpsilon);
#pragma unroll
  for (int k = 0; k < vec::kMaxVectorsPerLane; ++k) {
    const int32_t c = vec::LaneColumn(lane, k, W);
    if (c < C) {
      const Vector<T> w = Load(weight + c), bi = Load(bias + c);
      Vector<T> o;
#pragma unroll
      for (int i = 0; i < W; ++i) {
        o.v[i] = FromFloat<T>((ToFloat(x[k].v[i]) - m) * s * ToFloat(w.v[i]) + ToFloat(bi.v[i]));
      }
      Store(out + base + c, o);
    }
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// Block b takes rows [begin, end) of vec::BackwardGrid; each warp its rows in steps of
// kBackwardWarps. Per row: the two row means of the input gradient from dout, x and the weight;
// then dinp = dresidual + gradient, written once, while the warp's own shared-memory slab sums
// dout·x̂ and dout per column. The second reading of dout, x and the weight comes from L1/L2:
// each element crosses HBM once. At the end the slabs are added in warp order into the block's
// partial sums.
template <typename T>
__global__ void __launch_bounds__(vec::kBackwardWarps * 32)
    LayerNormBackwardKernel(T* dinp, const T* dresidual, const T* dout, const T* inp,
                            const T* weight, const float* mean, const float* rstd, float* partials,
                            int32_t N, int32_t C, int32_t rows_per_block) {
  constexpr int W = Vector<T>::kWidth, kQuarters = W / 4;
  FR_DYNAMIC_SHARED(float4, shared);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t slab = static_cast<int32_t>(vec::SlabFloats(C, W)) / 4;  // in float4s
  float4* dw_sum = shared + warp * 2 * slab;
  float4* db_sum = dw_sum + slab;
  // A lane's quarter q of its vector k: float4 (k·kQuarters + q)·32 + lane of its slabs.
  for (int k = 0; vec::LaneColumn(lane, k, W) < C; ++k) {
#pragma unroll
    for (int q = 0; q < kQuarters; ++q) {
      dw_sum[(k * kQuarters + q) * 32 + lane] = db_sum[(k * kQuarters + q) * 32 + lane] =
          make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  const int32_t begin = blockIdx.x * rows_per_block;
  const int32_t end = min(N, begin + rows_per_block);
  for (int32_t row = begin + warp; row < end; row += vec::kBackwardWarps) {
    const int32_t base = row * C;
    const float m = mean[row], s = rstd[row];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int32_t c = lane * W; c < C; c += 32 * W) {
      const Vector<T> d = Load(dout + base + c), x = Load(inp + base + c), w = Load(weight + c);
#pragma unroll
      for (int i = 0; i < W; ++i) {
        const float dnorm = ToFloat(w.v[i]) * ToFloat(d.v[i]);
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * (ToFloat(x.v[i]) - m) * s;
      }
    }
    dnorm_mean = WarpSum(dnorm_mean) / C;
    dnorm_norm_mean = WarpSum(dnorm_norm_mean) / C;
    for (int k = 0; vec::LaneColumn(lane, k, W) < C; ++k) {
      const int32_t c = vec::LaneColumn(lane, k, W);
      const Vector<T> d = Load(dout + base + c), x = Load(inp + base + c), w = Load(weight + c);
      const Vector<T> r = Load(dresidual + base + c);
      Vector<T> o;
      float dw[W], db[W];
#pragma unroll
      for (int i = 0; i < W; ++i) {
        const float dv = ToFloat(d.v[i]), norm = (ToFloat(x.v[i]) - m) * s;
        const float g = (ToFloat(w.v[i]) * dv - dnorm_mean - norm * dnorm_norm_mean) * s;
        o.v[i] = FromFloat<T>(ToFloat(r.v[i]) + g);
        dw[i] = dv * norm;
        db[i] = dv;
      }
      Store(dinp + base + c, o);
#pragma unroll
      for (int q = 0; q < kQuarters; ++q) {
        float4& sw = dw_sum[(k * kQuarters + q) * 32 + lane];
        float4& sb = db_sum[(k * kQuarters + q) * 32 + lane];
        sw.x += dw[4 * q], sw.y += dw[4 * q + 1], sw.z += dw[4 * q + 2], sw.w += dw[4 * q + 3];
        sb.x += db[4 * q], sb.y += db[4 * q + 1], sb.z += db[4 * q + 2], sb.w += db[4 * q + 3];
      }
    }
  }
  __syncthreads();
  const float* slabs = reinterpret_cast<const float*>(shared);
  for (int32_t c = threadIdx.x; c < C; c += blockDim.x) {
    const int32_t at = static_cast<int32_t>(vec::SlabIndex(c, W));
    float dw = 0.0f, db = 0.0f;
    for (int w = 0; w < vec::kBackwardWarps; ++w) {
      dw += slabs[w * 8 * slab + at];
      db += slabs[w * 8 * slab + 4 * slab + at];
    }
    partials[blockIdx.x * C + c] = dw;
    partials[(gridDim.x + blockIdx.x) * C + c] = db;
  }
}

}  // namespace

template <typename T>
void FusedResidualLayerNormForward(T* residual, T* out, float* mean, float* rstd, const T* a,
                                   const T* b, const T* weight, const T* bias, int64_t N, int64_t C,
                                   cudaStream_t stream) {
  FR_LAUNCH(static_cast<unsigned>(vec::ForwardBlocks(N)), vec::kForwardWarps * 32, 0, stream,
            ResidualLayerNormForwardKernel<T>)(residual, out, mean, rstd, a, b, weight, bias,
                                               static_cast<int32_t>(N), static_cast<int32_t>(C));
}

template <typename T>
void FusedLayerNormBackward(T* dinp, const T* dresidual, float* dweight, float* dbias,
                            const T* dout, const T* inp, const T* weight, const float* mean,
                            const float* rstd, int64_t N, int64_t C, float* partials,
                            cudaStream_t stream) {
  const vec::RowChunks grid = vec::BackwardGrid(N);
  const int64_t shared = vec::BackwardSharedBytes(C, Vector<T>::kWidth);
  if (shared > 48 * 1024) {  // beyond the default limit: opt in (per device, so every time)
    cudaFuncSetAttribute(LayerNormBackwardKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(shared));
  }
  FR_LAUNCH(static_cast<unsigned>(grid.chunks), vec::kBackwardWarps * 32,
            static_cast<size_t>(shared), stream, LayerNormBackwardKernel<T>)(
      dinp, dresidual, dout, inp, weight, mean, rstd, partials, static_cast<int32_t>(N),
      static_cast<int32_t>(C), static_cast<int32_t>(grid.rows));
  FinishColumnSums(dweight, dbias, partials, grid.chunks, C, stream);
}

#define FR_INSTANTIATE(T)                                                                         \
  template void FusedResidualLayerNormForward<T>(T*, T*, float*, float*, const T*, const T*,      \
                                                 const T*, const T*, int64_t, int64_t,            \
                                                 cudaStream_t);                                   \
  template void FusedLayerNormBackward<T>(T*, const T*, float*, float*, const T*, const T*,       \
                                          const T*, const float*, const float*, int64_t, int64_t, \
                                          float*, cudaStream_t);
FR_INSTANTIATE(float)
FR_INSTANTIATE(__nv_bfloat16)
#undef FR_INSTANTIATE

}  // namespace freeride::cuda
