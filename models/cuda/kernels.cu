// The kernels behind kernels.h, one per layer step, each readable top to bottom. Reductions
// use warp shuffles and fixed trees (never atomics), so results do not depend on scheduling.
#include <cmath>

#include "models/cuda/attention_layout.h"
#include "models/cuda/kernels.h"
#include "models/cuda/launch.h"
#include "models/device_reductions.h"

namespace freeride::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(bf16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) { return x; }
template <>
__device__ __forceinline__ bf16 FromFloat<bf16>(float x) { return __float2bfloat16_rn(x); }

template <typename A>
__device__ __forceinline__ A WarpSum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum (or max) over a block of kThreads threads; every thread gets the result.
template <typename A, bool kMax = false>
__device__ A BlockReduce(A v) {
  __shared__ A warp_values[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if constexpr (kMax) v = WarpMax(v); else v = WarpSum(v);
  if (lane == 0) warp_values[warp] = v;
  __syncthreads();
  A r = lane < kThreads / 32 ? warp_values[lane] : (kMax ? A(-INFINITY) : A(0));
  if constexpr (kMax) r = WarpMax(r); else r = WarpSum(r);
  // warp_values may be reused by the caller's next reduction of the same type; no kernel makes
  // one yet (the softmax's max and sum are two instantiations, two arrays).
  __syncthreads();  // mutant-invisible: no kernel reduces twice with one instantiation
  return r;
}

inline unsigned Blocks(int64_t n, int threads = kThreads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

// ---- embedding ---------------------------------------------------------------------------

template <typename T>
__global__ void EncoderForwardKernel(T* out, const int32_t* tokens, const T* wte, const T* wpe,
                                     int64_t BT, int64_t Tlen, int64_t C) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= BT * C) return;
  const int64_t row = i / C, c = i % C;
  const float position = wpe == nullptr ? 0.0f : ToFloat(wpe[(row % Tlen) * C + c]);
  out[i] = FromFloat<T>(ToFloat(wte[tokens[row] * C + c]) + position);
}

template <typename T>
__global__ void EncoderWteGradKernel(float* dwte, const T* dout, const int32_t* positions,
                                     const int32_t* tokens, const int32_t* starts, int64_t C) {
  const int64_t u = blockIdx.x, c = blockIdx.y * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float sum = 0;
  for (int32_t k = starts[u]; k < starts[u + 1]; ++k) sum += ToFloat(dout[positions[k] * C + c]);
  dwte[tokens[u] * C + c] += sum;
}

template <typename T>
__global__ void EncoderWpeGradKernel(float* dwpe, const T* dout, int64_t B, int64_t Tlen,
                                     int64_t C) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= Tlen * C) return;
  float sum = 0;
  for (int64_t b = 0; b < B; ++b) sum += ToFloat(dout[b * Tlen * C + i]);
  dwpe[i] += sum;
}

// ---- LayerNorm ---------------------------------------------------------------------------

template <typename T>
__global__ void LayerNormForwardKernel(T* out, float* mean, float* rstd, const T* inp,
                                       const T* weight, const T* bias, int64_t N, int64_t C) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const T* x = inp + row * C;
  float sum = 0;
  for (int64_t c = lane; c < C; c += 32) sum += ToFloat(x[c]);
  const float m = WarpSum(sum) / C;
  float var = 0;
  for (int64_t c = lane; c < C; c += 32) {
    const float d = ToFloat(x[c]) - m;
    var += d * d;
  }
  const float s = rsqrtf(WarpSum(var) / C + 1e-5f);
  T* o = out + row * C;
  for (int64_t c = lane; c < C; c += 32) {
    o[c] = FromFloat<T>((ToFloat(x[c]) - m) * s * ToFloat(weight[c]) + ToFloat(bias[c]));
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

template <typename T>
__global__ void LayerNormBackwardInputKernel(T* dinp, const T* dout, const T* inp,
                                             const T* weight, const float* mean,
                                             const float* rstd, int64_t N, int64_t C) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const T* d = dout + row * C;
  const T* x = inp + row * C;
  const float m = mean[row], s = rstd[row];
  float dnorm_mean = 0, dnorm_norm_mean = 0;
  for (int64_t c = lane; c < C; c += 32) {
    const float dnorm = ToFloat(weight[c]) * ToFloat(d[c]);
    dnorm_mean += dnorm;
    dnorm_norm_mean += dnorm * (ToFloat(x[c]) - m) * s;
  }
  dnorm_mean = WarpSum(dnorm_mean) / C;
  dnorm_norm_mean = WarpSum(dnorm_norm_mean) / C;
  T* di = dinp + row * C;
  for (int64_t c = lane; c < C; c += 32) {
    const float norm = (ToFloat(x[c]) - m) * s;
    const float g = (ToFloat(weight[c]) * ToFloat(d[c]) - dnorm_mean - norm * dnorm_norm_mean) * s;
    di[c] = FromFloat<T>(ToFloat(di[c]) + g);
  }
}

// Column sums in two passes: chunk r of the rows → partials[r, c], then the chunks in order.
// `Value(row, c)` is what is summed; LayerNorm sums two values per column at once.
template <typename T>
__global__ void LayerNormWeightPartialsKernel(float* partials, const T* dout, const T* inp,
                                              const float* mean, const float* rstd, int64_t N,
                                              int64_t C) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, r = blockIdx.y;
  if (c >= C) return;
  const int64_t rows = (N + kColumnChunks - 1) / kColumnChunks;
  float dw = 0, db = 0;
  for (int64_t n = r * rows; n < min(N, (r + 1) * rows); ++n) {
    const float d = ToFloat(dout[n * C + c]);
    dw += d * (ToFloat(inp[n * C + c]) - mean[n]) * rstd[n];
    db += d;
  }
  partials[r * C + c] = dw;
  partials[(kColumnChunks + r) * C + c] = db;
}

template <typename T>
__global__ void ColumnPartialsKernel(float* partials, const T* x, int64_t N, int64_t C) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, r = blockIdx.y;
  if (c >= C) return;
  const int64_t rows = (N + kColumnChunks - 1) / kColumnChunks;
  float sum = 0;
  for (int64_t n = r * rows; n < min(N, (r + 1) * rows); ++n) sum += ToFloat(x[n * C + c]);
  partials[r * C + c] = sum;
}

// dst[c] += Σ_r partials[r, c], r in order.
__global__ void SumPartialsKernel(float* dst, const float* partials, int64_t C) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float sum = 0;
  for (int64_t r = 0; r < kColumnChunks; ++r) sum += partials[r * C + c];
  dst[c] += sum;
}

// ---- element-wise ------------------------------------------------------------------------

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/π)

template <typename T>
__global__ void GeluForwardKernel(T* out, const T* inp, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float x = ToFloat(inp[i]);
  out[i] = FromFloat<T>(0.5f * x * (1.0f + tanhf(kGeluScale * (x + 0.044715f * x * x * x))));
}

template <typename T>
__global__ void GeluBackwardKernel(T* dinp, const T* inp, const T* dout, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float x = ToFloat(inp[i]);
  const float th = tanhf(kGeluScale * (x + 0.044715f * x * x * x));
  const float local = 0.5f * (1.0f + th) +
                      0.5f * x * (1.0f - th * th) * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
  dinp[i] = FromFloat<T>(local * ToFloat(dout[i]));
}

template <typename T>
__global__ void ResidualKernel(T* out, const T* a, const T* b, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = FromFloat<T>(ToFloat(a[i]) + ToFloat(b[i]));
}

__global__ void AddInPlaceKernel(float* dst, const float* src, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) dst[i] += src[i];
}

template <typename To, typename From>
__global__ void ConvertKernel(To* dst, const From* src, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) dst[i] = FromFloat<To>(ToFloat(src[i]));
}

// ---- attention ---------------------------------------------------------------------------

template <typename T>
__global__ void SplitHeadsKernel(T* heads, const T* qkv, int64_t Bn, int64_t Tlen, int64_t C,
                                 int64_t NH) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < Bn * Tlen * 3 * C) heads[QkvToHeadMajor(i, Bn, Tlen, C, NH)] = qkv[i];
}

template <typename T>
__global__ void MergeHeadsGradKernel(T* dqkv, const T* heads, int64_t Bn, int64_t Tlen,
                                     int64_t C, int64_t NH) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < Bn * Tlen * 3 * C) dqkv[i] = heads[QkvToHeadMajor(i, Bn, Tlen, C, NH)];
}

template <typename T>
__global__ void MergeHeadsKernel(T* out, const T* y, int64_t n, int64_t Tlen, int64_t C,
                                 int64_t NH) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = y[OutToHeadMajor(i, Tlen, C, NH)];
}

template <typename T>
__global__ void SplitHeadsGradKernel(T* dy, const T* dout, int64_t n, int64_t Tlen, int64_t C,
                                     int64_t NH) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) dy[OutToHeadMajor(i, Tlen, C, NH)] = dout[i];
}

template <typename T>
__global__ void CausalSoftmaxForwardKernel(T* att, float* lse, float scale, int64_t rows,
                                           int64_t Tlen) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int64_t t = row % Tlen;
  T* x = att + row * Tlen;
  float mx = -INFINITY;
  for (int64_t j = lane; j <= t; j += 32) mx = fmaxf(mx, scale * ToFloat(x[j]));
  mx = WarpMax(mx);
  float sum = 0;
  for (int64_t j = lane; j <= t; j += 32) sum += expf(scale * ToFloat(x[j]) - mx);
  sum = WarpSum(sum);
  const float inv = 1.0f / sum;
  for (int64_t j = lane; j < Tlen; j += 32) {
    x[j] = FromFloat<T>(j <= t ? expf(scale * ToFloat(x[j]) - mx) * inv : 0.0f);
  }
  if (lane == 0) lse[row] = mx + logf(sum);
}

template <typename T>
__global__ void CausalSoftmaxRecomputeKernel(T* att, const float* lse, float scale, int64_t rows,
                                             int64_t Tlen) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * Tlen) return;
  const int64_t row = i / Tlen, j = i % Tlen, t = row % Tlen;
  att[i] = FromFloat<T>(j <= t ? expf(scale * ToFloat(att[i]) - lse[row]) : 0.0f);
}

template <typename T>
__global__ void CausalSoftmaxBackwardKernel(T* datt, const T* att, float scale, int64_t rows,
                                            int64_t Tlen) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int64_t t = row % Tlen;
  T* d = datt + row * Tlen;
  const T* a = att + row * Tlen;
  float weighted = 0;
  for (int64_t j = lane; j <= t; j += 32) weighted += ToFloat(a[j]) * ToFloat(d[j]);
  weighted = WarpSum(weighted);
  for (int64_t j = lane; j < Tlen; j += 32) {
    d[j] = FromFloat<T>(j <= t ? ToFloat(a[j]) * (ToFloat(d[j]) - weighted) * scale : 0.0f);
  }
}

// ---- classifier --------------------------------------------------------------------------

template <typename T>
__global__ void CrossEntropyForwardKernel(float* losses, float* logsumexp, const T* logits,
                                          const int32_t* targets, int64_t V, int64_t Vp) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * Vp;
  float mx = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, ToFloat(x[v]));
  mx = BlockReduce<float, true>(mx);
  float sum = 0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) sum += expf(ToFloat(x[v]) - mx);
  sum = BlockReduce<float>(sum);
  if (threadIdx.x == 0) {
    const float lse = mx + logf(sum);
    logsumexp[row] = lse;
    losses[row] = lse - ToFloat(x[targets[row]]);
  }
}

template <typename T>
__global__ void CrossEntropyBackwardKernel(T* logits, const float* logsumexp,
                                           const int32_t* targets, float scale, int64_t V,
                                           int64_t Vp) {
  const int64_t row = blockIdx.x;
  T* x = logits + row * Vp;
  const float lse = logsumexp[row];
  const int32_t target = targets[row];
  for (int64_t v = threadIdx.x; v < Vp; v += blockDim.x) {
    const float p = v < V ? expf(ToFloat(x[v]) - lse) : 0.0f;
    x[v] = FromFloat<T>(v < V ? scale * (p - (v == target ? 1.0f : 0.0f)) : 0.0f);
  }
}

// ---- reductions and the optimizer --------------------------------------------------------

template <bool kSquare>
__global__ void PartialSumsKernel(double* partials, const float* x, int64_t n) {
  double sum = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const double v = x[i];
    sum += kSquare ? v * v : v;
  }
  sum = BlockReduce<double>(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

__global__ void FinishSumKernel(double* out, const double* partials, bool accumulate) {
  double sum = 0;
  for (int64_t i = threadIdx.x; i < kReduceBlocks; i += blockDim.x) sum += partials[i];
  sum = BlockReduce<double>(sum);
  if (threadIdx.x == 0) out[0] = accumulate ? out[0] + sum : sum;
}

__global__ void AdamWKernel(float* master, bf16* compute, const float* grad, float* m, float* v,
                            int64_t n, AdamWArgs a) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float g = grad[i] * a.grad_scale;
  const float mi = a.beta1 * m[i] + (1.0f - a.beta1) * g;
  const float vi = a.beta2 * v[i] + (1.0f - a.beta2) * g * g;
  m[i] = mi;
  v[i] = vi;
  float p = master[i] * (1.0f - a.lr * a.weight_decay);
  p -= (a.lr / a.bias_correction1) * mi / (sqrtf(vi) / sqrtf(a.bias_correction2) + a.eps);
  master[i] = p;
  if (compute != nullptr) compute[i] = __float2bfloat16_rn(p);
}

}  // namespace

template <typename T>
void EncoderForward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t B,
                    int64_t Tlen, int64_t C, cudaStream_t stream) {
  FR_LAUNCH(Blocks(B * Tlen * C), kThreads, 0, stream, EncoderForwardKernel<T>)(
      out, tokens, wte, wpe, B * Tlen, Tlen, C);
}

template <typename T>
void EncoderBackwardWeight(float* dwte, float* dwpe, const T* dout, const int32_t* positions,
                           const int32_t* tokens, const int32_t* starts, int64_t distinct,
                           int64_t B, int64_t Tlen, int64_t C, cudaStream_t stream) {
  if (distinct > 0) {
    const dim3 grid(static_cast<unsigned>(distinct), Blocks(C, 128));
    FR_LAUNCH(grid, 128, 0, stream, EncoderWteGradKernel<T>)(dwte, dout, positions, tokens, starts,
                                                             C);
  }
  if (dwpe == nullptr) return;
  FR_LAUNCH(Blocks(Tlen * C), kThreads, 0, stream, EncoderWpeGradKernel<T>)(dwpe, dout, B, Tlen, C);
}

template <typename T>
void LayerNormForward(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                      const T* bias, int64_t N, int64_t C, cudaStream_t stream) {
  FR_LAUNCH(Blocks(N * 32), kThreads, 0, stream, LayerNormForwardKernel<T>)(out, mean, rstd, inp,
                                                                            weight, bias, N, C);
}

template <typename T>
void LayerNormBackwardInput(T* dinp, const T* dout, const T* inp, const T* weight,
                            const float* mean, const float* rstd, int64_t N, int64_t C,
                            cudaStream_t stream) {
  FR_LAUNCH(Blocks(N * 32), kThreads, 0, stream, LayerNormBackwardInputKernel<T>)(
      dinp, dout, inp, weight, mean, rstd, N, C);
}

template <typename T>
void LayerNormBackwardWeight(float* dweight, float* dbias, const T* dout, const T* inp,
                             const float* mean, const float* rstd, int64_t N, int64_t C,
                             float* partials, cudaStream_t stream) {
  const dim3 grid(Blocks(C), static_cast<unsigned>(kColumnChunks));
  FR_LAUNCH(grid, kThreads, 0, stream, LayerNormWeightPartialsKernel<T>)(partials, dout, inp, mean,
                                                                         rstd, N, C);
  FR_LAUNCH(Blocks(C), kThreads, 0, stream, SumPartialsKernel)(dweight, partials, C);
  FR_LAUNCH(Blocks(C), kThreads, 0, stream, SumPartialsKernel)(dbias, partials + kColumnChunks * C,
                                                               C);
}

template <typename T>
void BiasBackward(float* dbias, const T* dout, int64_t N, int64_t OC, float* partials,
                  cudaStream_t stream) {
  const dim3 grid(Blocks(OC), static_cast<unsigned>(kColumnChunks));
  FR_LAUNCH(grid, kThreads, 0, stream, ColumnPartialsKernel<T>)(partials, dout, N, OC);
  FR_LAUNCH(Blocks(OC), kThreads, 0, stream, SumPartialsKernel)(dbias, partials, OC);
}

template <typename T>
void GeluForward(T* out, const T* inp, int64_t n, cudaStream_t stream) {
  FR_LAUNCH(Blocks(n), kThreads, 0, stream, GeluForwardKernel<T>)(out, inp, n);
}
template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, int64_t n, cudaStream_t stream) {
  FR_LAUNCH(Blocks(n), kThreads, 0, stream, GeluBackwardKernel<T>)(dinp, inp, dout, n);
}
template <typename T>
void ResidualForward(T* out, const T* a, const T* b, int64_t n, cudaStream_t stream) {
  FR_LAUNCH(Blocks(n), kThreads, 0, stream, ResidualKernel<T>)(out, a, b, n);
}
template <typename T>
void Copy(T* dst, const T* src, int64_t n, cudaStream_t stream) {
  cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToDevice, stream);
}
void AddInPlace(float* dst, const float* src, int64_t n, cudaStream_t stream) {
  FR_LAUNCH(Blocks(n), kThreads, 0, stream, AddInPlaceKernel)(dst, src, n);
}
template <typename To, typename From>
void Convert(To* dst, const From* src, int64_t n, cudaStream_t stream) {
  FR_LAUNCH(Blocks(n), kThreads, 0, stream, ConvertKernel<To, From>)(dst, src, n);
}

template <typename T>
void SplitHeads(T* qkv_heads, const T* qkv, int64_t B, int64_t Tlen, int64_t C, int64_t NH,
                cudaStream_t stream) {
  FR_LAUNCH(Blocks(B * Tlen * 3 * C), kThreads, 0, stream, SplitHeadsKernel<T>)(qkv_heads, qkv, B,
                                                                                Tlen, C, NH);
}
template <typename T>
void MergeHeadsGrad(T* dqkv, const T* dqkv_heads, int64_t B, int64_t Tlen, int64_t C, int64_t NH,
                    cudaStream_t stream) {
  FR_LAUNCH(Blocks(B * Tlen * 3 * C), kThreads, 0, stream, MergeHeadsGradKernel<T>)(
      dqkv, dqkv_heads, B, Tlen, C, NH);
}
template <typename T>
void MergeHeads(T* out, const T* y, int64_t B, int64_t Tlen, int64_t C, int64_t NH,
                cudaStream_t stream) {
  FR_LAUNCH(Blocks(B * Tlen * C), kThreads, 0, stream, MergeHeadsKernel<T>)(out, y, B * Tlen * C,
                                                                            Tlen, C, NH);
}
template <typename T>
void SplitHeadsGrad(T* dy, const T* dout, int64_t B, int64_t Tlen, int64_t C, int64_t NH,
                    cudaStream_t stream) {
  FR_LAUNCH(Blocks(B * Tlen * C), kThreads, 0, stream, SplitHeadsGradKernel<T>)(
      dy, dout, B * Tlen * C, Tlen, C, NH);
}
template <typename T>
void CausalSoftmaxForward(T* att, float* lse, float scale, int64_t rows, int64_t Tlen,
                          cudaStream_t stream) {
  FR_LAUNCH(Blocks(rows * 32), kThreads, 0, stream, CausalSoftmaxForwardKernel<T>)(att, lse, scale,
                                                                                   rows, Tlen);
}
template <typename T>
void CausalSoftmaxRecompute(T* att, const float* lse, float scale, int64_t rows, int64_t Tlen,
                            cudaStream_t stream) {
  FR_LAUNCH(Blocks(rows * Tlen), kThreads, 0, stream, CausalSoftmaxRecomputeKernel<T>)(
      att, lse, scale, rows, Tlen);
}
template <typename T>
void CausalSoftmaxBackward(T* datt, const T* att, float scale, int64_t rows, int64_t Tlen,
                           cudaStream_t stream) {
  FR_LAUNCH(Blocks(rows * 32), kThreads, 0, stream, CausalSoftmaxBackwardKernel<T>)(
      datt, att, scale, rows, Tlen);
}

template <typename T>
void CrossEntropyForward(float* losses, float* logsumexp, const T* logits,
                         const int32_t* targets, int64_t N, int64_t V, int64_t Vp,
                         cudaStream_t stream) {
  FR_LAUNCH(static_cast<unsigned>(N), kThreads, 0, stream, CrossEntropyForwardKernel<T>)(
      losses, logsumexp, logits, targets, V, Vp);
}
template <typename T>
void CrossEntropyBackward(T* logits, const float* logsumexp, const int32_t* targets,
                          float scale, int64_t N, int64_t V, int64_t Vp, cudaStream_t stream) {
  FR_LAUNCH(static_cast<unsigned>(N), kThreads, 0, stream, CrossEntropyBackwardKernel<T>)(
      logits, logsumexp, targets, scale, V, Vp);
}

void Sum(double* out, const float* x, int64_t n, double* partials, cudaStream_t stream) {
  FR_LAUNCH(kReduceBlocks, kThreads, 0, stream, PartialSumsKernel<false>)(partials, x, n);
  FR_LAUNCH(1, kThreads, 0, stream, FinishSumKernel)(out, partials, false);
}
void SumOfSquares(double* out, const float* x, int64_t n, bool accumulate, double* partials,
                  cudaStream_t stream) {
  FR_LAUNCH(kReduceBlocks, kThreads, 0, stream, PartialSumsKernel<true>)(partials, x, n);
  FR_LAUNCH(1, kThreads, 0, stream, FinishSumKernel)(out, partials, accumulate);
}

void AdamW(float* master, bf16* compute, const float* grad, float* m, float* v, int64_t n,
           const AdamWArgs& args, cudaStream_t stream) {
  FR_LAUNCH(Blocks(n), kThreads, 0, stream, AdamWKernel)(master, compute, grad, m, v, n, args);
}

#define FR_INSTANTIATE(T)                                                                      \
  template void EncoderForward<T>(T*, const int32_t*, const T*, const T*, int64_t, int64_t,   \
                                  int64_t, cudaStream_t);                                      \
  template void EncoderBackwardWeight<T>(float*, float*, const T*, const int32_t*,            \
                                         const int32_t*, const int32_t*, int64_t, int64_t,    \
                                         int64_t, int64_t, cudaStream_t);                      \
  template void LayerNormForward<T>(T*, float*, float*, const T*, const T*, const T*, int64_t, \
                                    int64_t, cudaStream_t);                                    \
  template void LayerNormBackwardInput<T>(T*, const T*, const T*, const T*, const float*,     \
                                          const float*, int64_t, int64_t, cudaStream_t);       \
  template void LayerNormBackwardWeight<T>(float*, float*, const T*, const T*, const float*,  \
                                           const float*, int64_t, int64_t, float*,            \
                                           cudaStream_t);                                      \
  template void BiasBackward<T>(float*, const T*, int64_t, int64_t, float*, cudaStream_t);    \
  template void GeluForward<T>(T*, const T*, int64_t, cudaStream_t);                           \
  template void GeluBackward<T>(T*, const T*, const T*, int64_t, cudaStream_t);                \
  template void ResidualForward<T>(T*, const T*, const T*, int64_t, cudaStream_t);             \
  template void Copy<T>(T*, const T*, int64_t, cudaStream_t);                                  \
  template void SplitHeads<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t, cudaStream_t); \
  template void MergeHeadsGrad<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t,           \
                                  cudaStream_t);                                               \
  template void MergeHeads<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t, cudaStream_t); \
  template void SplitHeadsGrad<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t,           \
                                  cudaStream_t);                                               \
  template void CausalSoftmaxForward<T>(T*, float*, float, int64_t, int64_t, cudaStream_t);    \
  template void CausalSoftmaxRecompute<T>(T*, const float*, float, int64_t, int64_t,           \
                                          cudaStream_t);                                       \
  template void CausalSoftmaxBackward<T>(T*, const T*, float, int64_t, int64_t, cudaStream_t); \
  template void CrossEntropyForward<T>(float*, float*, const T*, const int32_t*, int64_t,     \
                                       int64_t, int64_t, cudaStream_t);                        \
  template void CrossEntropyBackward<T>(T*, const float*, const int32_t*, float, int64_t,      \
                                        int64_t, int64_t, cudaStream_t);
FR_INSTANTIATE(float)
FR_INSTANTIATE(bf16)
#undef FR_INSTANTIATE

template void Convert<float, bf16>(float*, const bf16*, int64_t, cudaStream_t);
template void Convert<bf16, float>(bf16*, const float*, int64_t, cudaStream_t);
template void Convert<float, float>(float*, const float*, int64_t, cudaStream_t);

}  // namespace freeride::cuda
