// bfloat16 for the emulation build: CUDA's __nv_bfloat16 and __nv_bfloat162 with the
// conversions the project uses. fp32 → bf16 rounds to nearest, ties to even (NaN stays a
// quiet NaN), as __float2bfloat16_rn does on the GPU; arithmetic goes through fp32.
#pragma once

#include <cstdint>
#include <cstring>

#include "models/cuda/emulation/qualifiers.h"

struct __nv_bfloat16 {
  uint16_t __x;
  __nv_bfloat16() = default;
  __host__ __device__ __nv_bfloat16(float f) : __x(RoundToNearestEven(f)) {}
  __host__ __device__ __nv_bfloat16(double f) : __x(RoundToNearestEven(static_cast<float>(f))) {}
  __host__ __device__ __nv_bfloat16(int i) : __x(RoundToNearestEven(static_cast<float>(i))) {}
  __host__ __device__ operator float() const {
    const uint32_t bits = static_cast<uint32_t>(__x) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  static uint16_t RoundToNearestEven(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<uint16_t>(bits >> 16);
  }
};
struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
using nv_bfloat16 = __nv_bfloat16;
using nv_bfloat162 = __nv_bfloat162;

__host__ __device__ inline float __bfloat162float(__nv_bfloat16 x) { return static_cast<float>(x); }
__host__ __device__ inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
__host__ __device__ inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
__host__ __device__ inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return {__nv_bfloat16(a), __nv_bfloat16(b)};
}
__host__ __device__ inline float __low2float(__nv_bfloat162 v) { return static_cast<float>(v.x); }
__host__ __device__ inline float __high2float(__nv_bfloat162 v) { return static_cast<float>(v.y); }
