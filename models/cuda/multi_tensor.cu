// The multi-tensor kernels behind multi_tensor.h: one block per table chunk, 128-bit loads
// where the chunk starts 16-byte aligned (every chunk of the shipped models), elementwise
// otherwise. No atomics: the norm's partials are combined in a fixed order.
#include <cstring>

#include "models/cuda/launch.h"
#include "models/cuda/multi_tensor.h"

namespace freeride::cuda {
namespace {

constexpr int kThreads = kMultiTensorThreads;
constexpr int kWidth = kMultiTensorWidth;

__device__ double BlockSum(double v) {
  __shared__ double warp_values[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (lane == 0) warp_values[warp] = v;
  __syncthreads();
  double r = lane < kThreads / 32 ? warp_values[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
  return r;
}

__device__ __forceinline__ double Square(float x) {
  const double v = x;
  return v * v;
}

__global__ void __launch_bounds__(kThreads)
    ChunkSquaresKernel(double* partials, const float* grads, const TensorChunk* chunks) {
  const TensorChunk c = chunks[blockIdx.x];
  const float* g = grads + c.offset;
  double sum = 0;
  int vectors = 0;
  if (c.offset % kWidth == 0) {
    vectors = c.elements / kWidth;
    const float4* g4 = reinterpret_cast<const float4*>(g);
    for (int i = threadIdx.x; i < vectors; i += kThreads) {
      const float4 x = g4[i];
      sum += Square(x.x) + Square(x.y) + Square(x.z) + Square(x.w);
    }
  }
  for (int i = vectors * kWidth + threadIdx.x; i < c.elements; i += kThreads) sum += Square(g[i]);
  sum = BlockSum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

__global__ void __launch_bounds__(kThreads)
    CombineUnitsKernel(double* units, const double* partials, const int32_t* unit_begin) {
  const int u = blockIdx.x;
  double sum = 0;
  for (int i = unit_begin[u] + threadIdx.x; i < unit_begin[u + 1]; i += kThreads) {
    sum += partials[i];
  }
  sum = BlockSum(sum);
  if (threadIdx.x == 0) units[u] = sum;
}

__global__ void __launch_bounds__(kThreads)
    MultiTensorAdamWKernel(float* master, bf16* compute, const float* grad, float* m, float* v,
                           const TensorChunk* chunks, AdamWScalars a, float weight_decay,
                           bool packed_master) {
  const TensorChunk c = chunks[blockIdx.x];
  const float wd = c.decayed ? weight_decay : 0.0f;
  const int64_t o = c.offset;
  // The moments at their own place (a ZeRO-1 share packs them: MakeShareTable), and the master
  // with them where it is the share's only.
  m += c.moment_offset - o;
  v += c.moment_offset - o;
  if (packed_master) master += c.moment_offset - o;
  int vectors = 0;
  if (o % kWidth == 0 && c.moment_offset % kWidth == 0) {
    vectors = c.elements / kWidth;
    float4* p4 = reinterpret_cast<float4*>(master + o);
    const float4* g4 = reinterpret_cast<const float4*>(grad + o);
    float4* m4 = reinterpret_cast<float4*>(m + o);
    float4* v4 = reinterpret_cast<float4*>(v + o);
    for (int i = threadIdx.x; i < vectors; i += kThreads) {
      float4 p = p4[i], mi = m4[i], vi = v4[i];
      const float4 g = g4[i];
      p.x = AdamWElement(p.x, g.x, &mi.x, &vi.x, wd, a);
      p.y = AdamWElement(p.y, g.y, &mi.y, &vi.y, wd, a);
      p.z = AdamWElement(p.z, g.z, &mi.z, &vi.z, wd, a);
      p.w = AdamWElement(p.w, g.w, &mi.w, &vi.w, wd, a);
      p4[i] = p;
      m4[i] = mi;
      v4[i] = vi;
      if (compute != nullptr) {
        // Four bf16 (8 bytes: the offset is a multiple of 4 elements), packed by memcpy (a
        // register move) rather than read through a uint2* into the local array.
        const __nv_bfloat162 pair[2] = {__floats2bfloat162_rn(p.x, p.y),
                                        __floats2bfloat162_rn(p.z, p.w)};
        uint2 packed;
        std::memcpy(&packed, pair, sizeof packed);
        reinterpret_cast<uint2*>(compute + o)[i] = packed;
      }
    }
  }
  for (int i = vectors * kWidth + threadIdx.x; i < c.elements; i += kThreads) {
    const float p = AdamWElement(master[o + i], grad[o + i], &m[o + i], &v[o + i], wd, a);
    master[o + i] = p;
    if (compute != nullptr) compute[o + i] = __float2bfloat16_rn(p);
  }
}

}  // namespace

void MultiTensorChunkSquares(double* chunk_partials, const float* grads, const TensorChunk* chunks,
                             int64_t counted_chunks, cudaStream_t stream) {
  if (counted_chunks == 0) return;
  FR_LAUNCH(static_cast<unsigned>(counted_chunks), kThreads, 0, stream, ChunkSquaresKernel)(
      chunk_partials, grads, chunks);
}

void MultiTensorCombineUnits(double* units, const double* chunk_partials, const int32_t* unit_begin,
                             int64_t num_units, cudaStream_t stream) {
  if (num_units == 0) return;
  FR_LAUNCH(static_cast<unsigned>(num_units), kThreads, 0, stream, CombineUnitsKernel)(
      units, chunk_partials, unit_begin);
}

void MultiTensorGradSquares(double* units, double* chunk_partials, const float* grads,
                            const TensorChunk* chunks, const int32_t* unit_begin,
                            int64_t counted_chunks, int64_t num_units, cudaStream_t stream) {
  if (num_units == 0) return;
  MultiTensorChunkSquares(chunk_partials, grads, chunks, counted_chunks, stream);
  MultiTensorCombineUnits(units, chunk_partials, unit_begin, num_units, stream);
}

void MultiTensorAdamW(float* master, bf16* compute, const float* grad, float* m, float* v,
                      const TensorChunk* chunks, int64_t num_chunks, const AdamWArgs& args,
                      cudaStream_t stream, bool packed_master) {
  if (num_chunks == 0) return;
  const AdamWScalars a{args.lr,
                       args.beta1,
                       args.beta2,
                       args.eps,
                       args.grad_scale,
                       args.bias_correction1,
                       args.bias_correction2};
  FR_LAUNCH(static_cast<unsigned>(num_chunks), kThreads, 0, stream, MultiTensorAdamWKernel)
  (master, compute, grad, m, v, chunks, a, args.weight_decay, packed_master);
}

}  // namespace freeride::cuda
