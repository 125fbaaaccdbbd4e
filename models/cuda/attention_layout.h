// Where the plain CUDA attention moves each element when it splits q, k, v into heads and
// merges the heads back: plain index arithmetic, compiled for the device by the kernels and
// for the host by the tests that check it without a GPU.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FR_HOST_DEVICE __host__ __device__
#else
#define FR_HOST_DEVICE
#endif

namespace freeride::cuda {

// qkv [B, T, 3C] (q, k, v side by side, heads inside each) element i → its index in the
// head-major layout [3][B, NH, T, hs].
FR_HOST_DEVICE inline int64_t QkvToHeadMajor(int64_t i, int64_t B, int64_t T, int64_t C,
                                             int64_t NH) {
  const int64_t hs = C / NH, r = i % (3 * C), bt = i / (3 * C);
  const int64_t b = bt / T, t = bt % T, which = r / C, h = (r % C) / hs, d = r % hs;
  return which * B * T * C + ((b * NH + h) * T + t) * hs + d;
}

// out [B, T, C] element i → its index in y [B, NH, T, hs].
FR_HOST_DEVICE inline int64_t OutToHeadMajor(int64_t i, int64_t T, int64_t C, int64_t NH) {
  const int64_t hs = C / NH, c = i % C, bt = i / C, b = bt / T, t = bt % T;
  return ((b * NH + c / hs) * T + t) * hs + c % hs;
}

}  // namespace freeride::cuda
