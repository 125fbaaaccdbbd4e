// Element-wise kernels at bandwidth (the fast arm of runtime.kernels; kernels.h keeps the
// reference ones): one 16-byte vector per thread, 32-bit indices. Precondition: n a multiple of
// the vector width (8 bf16, 4 floats) below 2³¹, pointers 16-byte aligned (vector_geometry.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace freeride::cuda {

// out = a + b.
template <typename T>
void VectorResidualForward(T* out, const T* a, const T* b, int64_t n, cudaStream_t stream);
// out = GELU(inp), tanh approximation; dinp = GELU'(inp)·dout.
template <typename T>
void VectorGeluForward(T* out, const T* inp, int64_t n, cudaStream_t stream);
template <typename T>
void VectorGeluBackward(T* dinp, const T* inp, const T* dout, int64_t n, cudaStream_t stream);

}  // namespace freeride::cuda
