// LayerNorm at memory bandwidth (the fast arm of runtime.kernels; kernels.h keeps the reference
// one-operation kernels these are tested against): 16-byte vectors, 32-bit indices, the residual
// add fused into the forward and the input and weight parts of the backward in one pass over the
// rows, with the residual gradient's copy folded in. Deterministic: no atomics, sums in an order
// fixed by the shape (vector_geometry.h).
//
// Precondition: vec::Supported(N, C, sizeof(T)) (CudaStage checks it when it plans, and runs the
// reference kernels otherwise), and 16-byte aligned pointers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace freeride::cuda {

// residual = a + b (rounded to T), out = LN(residual) with mean and rstd kept for backward: a
// and b read once, residual and out written once. Without b (null): out = LN(a), and residual
// is not written (it may be null).
template <typename T>
void FusedResidualLayerNormForward(T* residual, T* out, float* mean, float* rstd, const T* a,
                                   const T* b, const T* weight, const T* bias, int64_t N, int64_t C,
                                   cudaStream_t stream);

// dinp = dresidual + the gradient through the normalisation (dresidual may be dinp itself), and
// dweight += Σ_rows dout·x̂, dbias += Σ_rows dout: one pass over the rows, then the column sums'
// second pass over `partials` (vec::BlockPartialFloats(N, C, sizeof(T)) floats).
template <typename T>
void FusedLayerNormBackward(T* dinp, const T* dresidual, float* dweight, float* dbias,
                            const T* dout, const T* inp, const T* weight, const float* mean,
                            const float* rstd, int64_t N, int64_t C, float* partials,
                            cudaStream_t stream);

}  // namespace freeride::cuda
