// Column sums at bandwidth, for the bias gradients (the fast arm of runtime.kernels; kernels.h's
// BiasBackward is the reference): one deterministic two-pass reduction over the whole GPU. The
// first pass sums chunks of rows into partials with 16-byte loads, enough blocks to fill an
// H100; the second adds the chunks column by column, in chunk order (vector_geometry.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace freeride::cuda {

// dst[c] += Σ_n x[n, c] for x [N, C]; `partials` holds vec::ColumnPartialFloats(N, C, width)
// floats. Precondition: C a multiple of the vector width, N·C < 2³¹, x 16-byte aligned.
template <typename T>
void ColumnSums(float* dst, const T* x, int64_t N, int64_t C, float* partials, cudaStream_t stream);

// The second pass alone: dst0[c] += Σ_k partials[k, c] over k < chunks, and, where dst1 is not
// null, dst1[c] += Σ_k partials[chunks + k, c].
void FinishColumnSums(float* dst0, float* dst1, const float* partials, int64_t chunks, int64_t C,
                      cudaStream_t stream);

}  // namespace freeride::cuda
