// Device helpers of the vectorised kernels: a 16-byte vector of elements (8 bf16 or 4 floats),
// loaded and stored in one instruction, the conversions to and from fp32, and a warp sum whose
// result is the same bits on every lane (the xor butterfly adds the same two values on both
// sides of each exchange, and float addition commutes). Included by .cu files only.
#pragma once

#include <cuda_bf16.h>

#include "models/cuda/vector_geometry.h"

namespace freeride::cuda::vec {

template <typename T>
struct alignas(kVectorBytes) Vector {
  static constexpr int kWidth = kVectorBytes / sizeof(T);
  T v[kWidth];
};

// The caller guarantees 16-byte alignment (vector_geometry.h's preconditions).
template <typename T>
__device__ __forceinline__ Vector<T> Load(const T* p) {
  return *reinterpret_cast<const Vector<T>*>(p);
}
template <typename T>
__device__ __forceinline__ void Store(T* p, const Vector<T>& x) {
  *reinterpret_cast<Vector<T>*>(p) = x;
}

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace freeride::cuda::vec
