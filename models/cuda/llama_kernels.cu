// The kernels behind llama_kernels.h, one per layer step, each readable top to bottom, in the
// order the CPU's (models/cpu/llama_kernels.cc) compute so that fp32 results agree to rounding.
#include <cuda_bf16.h>

#include <cmath>

#include "models/cuda/column_sums.h"
#include "models/cuda/launch.h"
#include "models/cuda/llama_kernels.h"
#include "models/cuda/vector_access.cuh"
#include "models/device_reductions.h"

namespace freeride::cuda {
namespace {

using vec::FromFloat;
using vec::ToFloat;
using vec::WarpSum;

constexpr int kThreads = 256;

inline unsigned Blocks(int64_t n, int threads = kThreads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

// ---- RMSNorm -----------------------------------------------------------------------------

// One warp per row.
template <typename T>
__global__ void RMSNormForwardKernel(T* out, float* rstd, const T* inp, const T* weight, float eps,
                                     int64_t N, int64_t C) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const T* x = inp + row * C;
  float squares = 0;
  for (int64_t c = lane; c < C; c += 32) squares += ToFloat(x[c]) * ToFloat(x[c]);
  const float s = 1.0f / sqrtf(WarpSum(squares) / C + eps);
  T* o = out + row * C;
  for (int64_t c = lane; c < C; c += 32)
    o[c] = FromFloat<T>(ToFloat(x[c]) * s * ToFloat(weight[c]));
  if (lane == 0) rstd[row] = s;
}

// d(x·s)/dx = s·(I − s²·x·xᵀ/C): the weighted gradient with its part along x projected out.
template <typename T>
__global__ void RMSNormBackwardInputKernel(T* dinp, const T* dout, const T* inp, const T* weight,
                                           const float* rstd, int64_t N, int64_t C) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const T* d = dout + row * C;
  const T* x = inp + row * C;
  const float s = rstd[row];
  float dot = 0;
  for (int64_t c = lane; c < C; c += 32) dot += ToFloat(weight[c]) * ToFloat(d[c]) * ToFloat(x[c]);
  const float k = WarpSum(dot) * s * s / C;
  T* di = dinp + row * C;
  for (int64_t c = lane; c < C; c += 32) {
    const float g = (ToFloat(weight[c]) * ToFloat(d[c]) - k * ToFloat(x[c])) * s;
    di[c] = FromFloat<T>(ToFloat(di[c]) + g);
  }
}

// Column sums in two passes (as kernels.cu's LayerNorm weights): chunk r of the rows →
// partials[r, c]; FinishColumnSums adds the chunks in order.
template <typename T>
__global__ void RMSNormWeightPartialsKernel(float* partials, const T* dout, const T* inp,
                                            const float* rstd, int64_t N, int64_t C) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, r = blockIdx.y;
  if (c >= C) return;
  const int64_t rows = (N + kColumnChunks - 1) / kColumnChunks;
  float dw = 0;
  for (int64_t n = r * rows; n < min(N, (r + 1) * rows); ++n) {
    dw += ToFloat(inp[n * C + c]) * rstd[n] * ToFloat(dout[n * C + c]);
  }
  partials[r * C + c] = dw;
}

// ---- rotary positions --------------------------------------------------------------------

// One thread per rotated pair (row, head, i < hs/2).
template <typename T>
__global__ void RopeKernel(T* x, const float* cos, const float* sin, int64_t rows, int64_t Tlen,
                           int64_t heads, int64_t hs, int64_t stride, float sign) {
  const int64_t half = hs / 2;
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= rows * heads * half) return;
  const int64_t i = j % half, h = (j / half) % heads, row = j / (half * heads);
  const int64_t t = row % Tlen;
  T* v = x + row * stride + h * hs;
  const float c = cos[t * half + i], sn = sign * sin[t * half + i];
  const float x1 = ToFloat(v[i]), x2 = ToFloat(v[i + half]);
  v[i] = FromFloat<T>(x1 * c - x2 * sn);
  v[i + half] = FromFloat<T>(x2 * c + x1 * sn);
}

// ---- SwiGLU ------------------------------------------------------------------------------

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

template <typename T>
__global__ void SwiGluForwardKernel(T* out, const T* h, int64_t N, int64_t F) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= N * F) return;
  const int64_t n = j / F, i = j % F;
  const float gate = ToFloat(h[n * 2 * F + i]), up = ToFloat(h[n * 2 * F + F + i]);
  out[j] = FromFloat<T>(gate * Sigmoid(gate) * up);
}

template <typename T>
__global__ void SwiGluBackwardKernel(T* dh, const T* h, const T* dout, int64_t N, int64_t F) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= N * F) return;
  const int64_t n = j / F, i = j % F;
  const float x = ToFloat(h[n * 2 * F + i]), up = ToFloat(h[n * 2 * F + F + i]);
  const float d = ToFloat(dout[j]), s = Sigmoid(x);
  dh[n * 2 * F + F + i] = FromFloat<T>(d * x * s);
  // silu'(x) = s · (1 + x · (1 − s)).
  dh[n * 2 * F + i] = FromFloat<T>(d * up * s * (1.0f + x * (1.0f - s)));
}

// ---- grouped-query attention's heads -----------------------------------------------------

// One thread per element of the head-major q, k, v [3][B, NH, T, hs]: which query head it
// belongs to decides the key/value head it copies.
template <typename T>
__global__ void GqaSplitHeadsKernel(T* heads, const T* qkv, int64_t B, int64_t Tlen, int64_t NH,
                                    int64_t NKV, int64_t hs) {
  const int64_t per = B * NH * Tlen * hs;
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= 3 * per) return;
  const int64_t which = j / per, r = j % per;
  const int64_t d = r % hs, t = (r / hs) % Tlen, h = (r / (hs * Tlen)) % NH;
  const int64_t b = r / (hs * Tlen * NH);
  const int64_t row = (b * Tlen + t) * (NH + 2 * NKV) * hs;
  const int64_t kv = h / (NH / NKV);
  const int64_t col = which == 0 ? h * hs : (NH + (which - 1) * NKV + kv) * hs;
  heads[j] = qkv[row + col + d];
}

// One thread per element of dqkv [B, T, (NH + 2·NKV)·hs]: a query element copies its head's, a
// key or value element sums its group's heads in order.
template <typename T>
__global__ void GqaMergeHeadsGradKernel(T* dqkv, const T* dheads, int64_t B, int64_t Tlen,
                                        int64_t NH, int64_t NKV, int64_t hs) {
  const int64_t width = (NH + 2 * NKV) * hs, per = B * NH * Tlen * hs;
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= B * Tlen * width) return;
  const int64_t col = j % width, bt = j / width, b = bt / Tlen, t = bt % Tlen;
  const int64_t head = col / hs, d = col % hs;
  auto at = [&](int64_t which, int64_t h) {
    return ToFloat(dheads[which * per + ((b * NH + h) * Tlen + t) * hs + d]);
  };
  if (head < NH) {
    dqkv[j] = dheads[((b * NH + head) * Tlen + t) * hs + d];
    return;
  }
  const int64_t which = head < NH + NKV ? 1 : 2;
  const int64_t kv = head - NH - (which - 1) * NKV, group = NH / NKV;
  float sum = at(which, kv * group);
  for (int64_t h = kv * group + 1; h < (kv + 1) * group; ++h) sum += at(which, h);
  dqkv[j] = FromFloat<T>(sum);
}

}  // namespace

template <typename T>
void RMSNormForward(T* out, float* rstd, const T* inp, const T* weight, float eps, int64_t N,
                    int64_t C, cudaStream_t stream) {
  FR_LAUNCH(Blocks(N * 32), kThreads, 0, stream, RMSNormForwardKernel<T>)
  (out, rstd, inp, weight, eps, N, C);
}

template <typename T>
void RMSNormBackwardInput(T* dinp, const T* dout, const T* inp, const T* weight, const float* rstd,
                          int64_t N, int64_t C, cudaStream_t stream) {
  FR_LAUNCH(Blocks(N * 32), kThreads, 0, stream, RMSNormBackwardInputKernel<T>)
  (dinp, dout, inp, weight, rstd, N, C);
}

template <typename T>
void RMSNormBackwardWeight(float* dweight, const T* dout, const T* inp, const float* rstd,
                           int64_t N, int64_t C, float* partials, cudaStream_t stream) {
  const dim3 grid(Blocks(C), static_cast<unsigned>(kColumnChunks));
  FR_LAUNCH(grid, kThreads, 0, stream, RMSNormWeightPartialsKernel<T>)
  (partials, dout, inp, rstd, N, C);
  FinishColumnSums(dweight, nullptr, partials, kColumnChunks, C, stream);
}

template <typename T>
void RopeInPlace(T* x, const float* cos, const float* sin, int64_t B, int64_t Tlen, int64_t heads,
                 int64_t hs, int64_t stride, bool inverse, cudaStream_t stream) {
  FR_LAUNCH(Blocks(B * Tlen * heads * (hs / 2)), kThreads, 0, stream, RopeKernel<T>)
  (x, cos, sin, B * Tlen, Tlen, heads, hs, stride, inverse ? -1.0f : 1.0f);
}

template <typename T>
void SwiGluForward(T* out, const T* h, int64_t N, int64_t F, cudaStream_t stream) {
  FR_LAUNCH(Blocks(N * F), kThreads, 0, stream, SwiGluForwardKernel<T>)(out, h, N, F);
}

template <typename T>
void SwiGluBackward(T* dh, const T* h, const T* dout, int64_t N, int64_t F, cudaStream_t stream) {
  FR_LAUNCH(Blocks(N * F), kThreads, 0, stream, SwiGluBackwardKernel<T>)(dh, h, dout, N, F);
}

template <typename T>
void GqaSplitHeads(T* heads, const T* qkv, int64_t B, int64_t Tlen, int64_t NH, int64_t NKV,
                   int64_t hs, cudaStream_t stream) {
  FR_LAUNCH(Blocks(3 * B * NH * Tlen * hs), kThreads, 0, stream, GqaSplitHeadsKernel<T>)
  (heads, qkv, B, Tlen, NH, NKV, hs);
}

template <typename T>
void GqaMergeHeadsGrad(T* dqkv, const T* dheads, int64_t B, int64_t Tlen, int64_t NH, int64_t NKV,
                       int64_t hs, cudaStream_t stream) {
  FR_LAUNCH(Blocks(B * Tlen * (NH + 2 * NKV) * hs), kThreads, 0, stream, GqaMergeHeadsGradKernel<T>)
  (dqkv, dheads, B, Tlen, NH, NKV, hs);
}

#define FR_INSTANTIATE(T)                                                                          \
  template void RMSNormForward<T>(T*, float*, const T*, const T*, float, int64_t, int64_t,         \
                                  cudaStream_t);                                                   \
  template void RMSNormBackwardInput<T>(T*, const T*, const T*, const T*, const float*, int64_t,   \
                                        int64_t, cudaStream_t);                                    \
  template void RMSNormBackwardWeight<T>(float*, const T*, const T*, const float*, int64_t,        \
                                         int64_t, float*, cudaStream_t);                           \
  template void RopeInPlace<T>(T*, const float*, const float*, int64_t, int64_t, int64_t, int64_t, \
                               int64_t, bool, cudaStream_t);                                       \
  template void SwiGluForward<T>(T*, const T*, int64_t, int64_t, cudaStream_t);                    \
  template void SwiGluBackward<T>(T*, const T*, const T*, int64_t, int64_t, cudaStream_t);         \
  template void GqaSplitHeads<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t, int64_t,        \
                                 cudaStream_t);                                                    \
  template void GqaMergeHeadsGrad<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t, int64_t,    \
                                     cudaStream_t);
FR_INSTANTIATE(float)
FR_INSTANTIATE(__nv_bfloat16)
#undef FR_INSTANTIATE

}  // namespace freeride::cuda
