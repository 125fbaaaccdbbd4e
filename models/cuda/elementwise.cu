// The vectorised element-wise kernels of elementwise.h: each thread one 16-byte vector, the
// arithmetic per element the reference kernels' (kernels.cu) to the bit.
#include <cuda_bf16.h>

#include "models/cuda/elementwise.h"
#include "models/cuda/launch.h"
#include "models/cuda/vector_access.cuh"

namespace freeride::cuda {
namespace {

using vec::FromFloat;
using vec::Load;
using vec::Store;
using vec::ToFloat;
using vec::Vector;

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/π)

template <typename T>
__global__ void ResidualKernel(T* out, const T* a, const T* b, int32_t n) {
  constexpr int W = Vector<T>::kWidth;
  const uint32_t i = (blockIdx.x * blockDim.x + threadIdx.x) * W;  // n + 2048 < 2³²
  if (i >= static_cast<uint32_t>(n)) return;
  const Vector<T> x = Load(a + i), y = Load(b + i);
  Vector<T> o;
#pragma unroll
  for (int k = 0; k < W; ++k) o.v[k] = FromFloat<T>(ToFloat(x.v[k]) + ToFloat(y.v[k]));
  Store(out + i, o);
}

template <typename T>
__global__ void GeluForwardKernel(T* out, const T* inp, int32_t n) {
  constexpr int W = Vector<T>::kWidth;
  const uint32_t i = (blockIdx.x * blockDim.x + threadIdx.x) * W;  // n + 2048 < 2³²
  if (i >= static_cast<uint32_t>(n)) return;
  const Vector<T> in = Load(inp + i);
  Vector<T> o;
#pragma unroll
  for (int k = 0; k < W; ++k) {
    const float x = ToFloat(in.v[k]);
    o.v[k] = FromFloat<T>(0.5f * x * (1.0f + tanhf(kGeluScale * (x + 0.044715f * x * x * x))));
  }
  Store(out + i, o);
}

template <typename T>
__global__ void GeluBackwardKernel(T* dinp, const T* inp, const T* dout, int32_t n) {
  constexpr int W = Vector<T>::kWidth;
  const uint32_t i = (blockIdx.x * blockDim.x + threadIdx.x) * W;  // n + 2048 < 2³²
  if (i >= static_cast<uint32_t>(n)) return;
  const Vector<T> in = Load(inp + i), d = Load(dout + i);
  Vector<T> o;
#pragma unroll
  for (int k = 0; k < W; ++k) {
    const float x = ToFloat(in.v[k]);
    const float th = tanhf(kGeluScale * (x + 0.044715f * x * x * x));
    const float local = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kGeluScale *
                                                 (1.0f + 3.0f * 0.044715f * x * x);
    o.v[k] = FromFloat<T>(local * ToFloat(d.v[k]));
  }
  Store(dinp + i, o);
}

template <typename T>
unsigned Blocks(int64_t n) {
  return static_cast<unsigned>(vec::ElementwiseBlocks(n, Vector<T>::kWidth));
}

}  // namespace

template <typename T>
void VectorResidualForward(T* out, const T* a, const T* b, int64_t n, cudaStream_t stream) {
  FR_LAUNCH(Blocks<T>(n), vec::kElementwiseThreads, 0, stream, ResidualKernel<T>)(
      out, a, b, static_cast<int32_t>(n));
}
template <typename T>
void VectorGeluForward(T* out, const T* inp, int64_t n, cudaStream_t stream) {
  FR_LAUNCH(Blocks<T>(n), vec::kElementwiseThreads, 0, stream, GeluForwardKernel<T>)(
      out, inp, static_cast<int32_t>(n));
}
template <typename T>
void VectorGeluBackward(T* dinp, const T* inp, const T* dout, int64_t n, cudaStream_t stream) {
  FR_LAUNCH(Blocks<T>(n), vec::kElementwiseThreads, 0, stream, GeluBackwardKernel<T>)(
      dinp, inp, dout, static_cast<int32_t>(n));
}

#define FR_INSTANTIATE(T)                                                                \
  template void VectorResidualForward<T>(T*, const T*, const T*, int64_t, cudaStream_t); \
  template void VectorGeluForward<T>(T*, const T*, int64_t, cudaStream_t);               \
  template void VectorGeluBackward<T>(T*, const T*, const T*, int64_t, cudaStream_t);
FR_INSTANTIATE(float)
FR_INSTANTIATE(__nv_bfloat16)
#undef FR_INSTANTIATE

}  // namespace freeride::cuda
