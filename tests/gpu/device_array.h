// What the kernel suites share: random inputs, a device array of T filled from and read back to
// fp32 host vectors, the values the device holds as the CPU reference sees them, and the
// tolerance of each element type (fp32 1e-5 relative, bf16 1e-2: inputs are rounded to bf16
// first, so the difference is only the kernel's own rounding).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"

namespace freeride::testing {

inline std::vector<float> Random(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(int64_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(&ptr_, std::max<int64_t>(n, 1) * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemset(ptr_, 0, std::max<int64_t>(n, 1) * sizeof(T)), cudaSuccess);
  }
  explicit DeviceArray(const std::vector<float>& host) : DeviceArray(host.size()) { Set(host); }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  void Set(const std::vector<float>& host) {
    std::vector<T> t(host.size());
    for (size_t i = 0; i < host.size(); ++i) t[i] = static_cast<T>(host[i]);
    EXPECT_EQ(cudaMemcpy(ptr_, t.data(), t.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<float> Get() const {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<T> t(n_);
    EXPECT_EQ(cudaMemcpy(t.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return std::vector<float>(t.begin(), t.end());
  }
  T* get() { return ptr_; }

 private:
  T* ptr_ = nullptr;
  int64_t n_;
};

// What the CPU reference sees: the same values the device holds (bf16-rounded for bf16).
template <typename T>
std::vector<float> AsDevice(std::vector<float> v) {
  for (float& x : v) x = static_cast<float>(static_cast<T>(x));
  return v;
}

template <typename T>
double Tolerance() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-2;
}

}  // namespace freeride::testing
