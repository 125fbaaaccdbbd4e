// The two-pass column sums of column_sums.h; the order of every addition is fixed by the shape
// (vector_geometry.h), so the same inputs give the same bits.
#include <cuda_bf16.h>

#include "models/cuda/column_sums.h"
#include "models/cuda/launch.h"
#include "models/cuda/vector_access.cuh"

namespace freeride::cuda {
namespace {

using vec::Load;
using vec::ToFloat;
using vec::Vector;

// Block (tile, chunk): lane `lane` of warp w sums the vector at the tile's column 32·W·tile +
// lane·W over rows begin + w, begin + w + kColumnWarps, ... < end, in order; then the warps'
// sums are added in warp order into partials[chunk, c].
template <typename T>
__global__ void __launch_bounds__(vec::kColumnWarps * 32)
    ColumnPartialsKernel(float* partials, const T* x, int32_t N, int32_t C, int32_t rows) {
  constexpr int W = Vector<T>::kWidth;
  __shared__ float warp_sums[vec::kColumnWarps][32 * W];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t c = (blockIdx.x * 32 + lane) * W;
  const int32_t begin = blockIdx.y * rows, end = min(N, begin + rows);
  float sum[W] = {};
  if (c < C) {
#pragma unroll 4  // loads in flight; the additions stay in row order
    for (int32_t n = begin + warp; n < end; n += vec::kColumnWarps) {
      const Vector<T> v = Load(x + n * C + c);
#pragma unroll
      for (int i = 0; i < W; ++i) sum[i] += ToFloat(v.v[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < W; ++i) warp_sums[warp][lane * W + i] = sum[i];
  __syncthreads();
  for (int j = threadIdx.x; j < 32 * W; j += blockDim.x) {
    const int32_t column = blockIdx.x * 32 * W + j;
    if (column >= C) continue;
    float total = 0.0f;
    for (int w = 0; w < vec::kColumnWarps; ++w) total += warp_sums[w][j];
    partials[blockIdx.y * C + column] = total;
  }
}

// Block (32 columns, array): slice s (a warp) sums chunks s, s + kFinishSlices, ... in order for
// its lane's column, then slice 0 adds the slices in order.
__global__ void __launch_bounds__(vec::kFinishSlices * 32)
    FinishColumnSumsKernel(float* dst0, float* dst1, const float* partials, int32_t chunks,
                           int32_t C) {
  __shared__ float slice_sums[vec::kFinishSlices][32];
  const int slice = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t c = blockIdx.x * 32 + lane;
  const float* p = partials + blockIdx.y * chunks * C;
  float sum = 0.0f;
  if (c < C) {
    for (int32_t k = slice; k < chunks; k += vec::kFinishSlices) sum += p[k * C + c];
  }
  slice_sums[slice][lane] = sum;
  __syncthreads();
  if (slice == 0 && c < C) {
    float total = 0.0f;
    for (int s = 0; s < vec::kFinishSlices; ++s) total += slice_sums[s][lane];
    float* dst = blockIdx.y == 0 ? dst0 : dst1;
    dst[c] += total;
  }
}

}  // namespace

template <typename T>
void ColumnSums(float* dst, const T* x, int64_t N, int64_t C, float* partials,
                cudaStream_t stream) {
  const vec::ColumnGrid g = vec::ColumnSumGrid(N, C, Vector<T>::kWidth);
  const dim3 grid(static_cast<unsigned>(g.column_tiles), static_cast<unsigned>(g.rows.chunks));
  FR_LAUNCH(grid, vec::kColumnWarps * 32, 0, stream, ColumnPartialsKernel<T>)(
      partials, x, static_cast<int32_t>(N), static_cast<int32_t>(C),
      static_cast<int32_t>(g.rows.rows));
  FinishColumnSums(dst, nullptr, partials, g.rows.chunks, C, stream);
}

void FinishColumnSums(float* dst0, float* dst1, const float* partials, int64_t chunks, int64_t C,
                      cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(vec::FinishColumnBlocks(C)), dst1 == nullptr ? 1u : 2u);
  FR_LAUNCH(grid, vec::kFinishSlices * 32, 0, stream, FinishColumnSumsKernel)(
      dst0, dst1, partials, static_cast<int32_t>(chunks), static_cast<int32_t>(C));
}

template void ColumnSums<float>(float*, const float*, int64_t, int64_t, float*, cudaStream_t);
template void ColumnSums<__nv_bfloat16>(float*, const __nv_bfloat16*, int64_t, int64_t, float*,
                                        cudaStream_t);

}  // namespace freeride::cuda
