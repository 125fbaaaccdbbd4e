// exp and tanh for the CPU kernels' float path, written with arithmetic only so that the
// compiler vectorises the softmax, GELU and SiLU loops (libm's expf is a scalar call). The
// double overloads keep libm: they are the reference the gradient checks use.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace freeride::cpu {

// e^x = 2^n · e^r with r in [-ln2/2, ln2/2] and a degree-6 polynomial for e^r; relative error
// about 2e-7 (1-2 ulp).
inline float VecExp(float x) {
  x = std::min(88.0f, std::max(-87.0f, x));
  // Round to nearest by the 1.5·2^23 trick (vectorises, unlike nearbyint without fast-math).
  const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;
  float p = 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}
inline double VecExp(double x) { return std::exp(x); }

// tanh(x) = 1 − 2 / (e^{2x} + 1), through VecExp (saturates correctly at both ends).
inline float VecTanh(float x) { return 1 - 2 / (VecExp(2 * x) + 1); }
inline double VecTanh(double x) { return std::tanh(x); }

}  // namespace freeride::cpu
