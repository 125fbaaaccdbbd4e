// The table the multi-tensor kernels (multi_tensor.h) run over: every parameter tensor of a
// chunk cut into chunks of at most kChunkElements, in model-unit order (the embedding's wte
// and wpe, each layer's tensors, the final LayerNorm), so that one launch covers every tensor
// and the gradient norm's per-unit sums combine a contiguous range of per-chunk partials in a
// fixed order. Built once on the host when the chunk is made; plain C++ so that CPU tests
// check it against the real ParamLayout. Also the per-element AdamW arithmetic, shared by the
// kernel and the tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "models/cuda/attention_layout.h"  // FR_HOST_DEVICE

namespace freeride {
// models/gpt2_config.h (C++20, which nvcc does not compile here).
struct ParamLayout;
struct ParamRange;  // models/grad_norm.h
struct StageSpec;
}  // namespace freeride

namespace freeride::cuda {

// Elements per chunk: a multiple of 8 so that chunks cut from a 16-byte-aligned tensor stay
// 16-byte aligned in fp32 and bf16; GPT-2 124M gets about 2000 chunks.
inline constexpr int64_t kChunkElements = 65536;
// Threads per block of the multi-tensor kernels (one block per chunk) and their vector width.
inline constexpr int kMultiTensorThreads = 256;
inline constexpr int kMultiTensorWidth = 4;  // floats per 128-bit load

struct TensorChunk {
  int64_t offset = 0;  // first element, into the chunk's parameter-sized buffers
  // Its first element in the AdamW moments: `offset` where they are whole, its place in the
  // packed moments of a ZeRO-1 share (MakeShareTable).
  int64_t moment_offset = 0;
  int32_t elements = 0;  // 1 … kChunkElements
  int32_t unit = -1;     // the gradient norm's unit; -1: not counted (wte on a head-only stage)
  int32_t decayed = 0;   // AdamW's weight decay applies
  int32_t pad = 0;
};

struct MultiTensorTable {
  // Counted chunks first, grouped by unit in unit order; then the uncounted ones.
  std::vector<TensorChunk> chunks;
  // Unit u's chunks are [unit_begin[u], unit_begin[u + 1]); units() + 1 entries.
  std::vector<int32_t> unit_begin;
  int64_t units() const { return static_cast<int64_t>(unit_begin.size()) - 1; }
  int64_t counted_chunks() const { return unit_begin.back(); }
};

// The table of `layout`'s present tensors. Units as StageModel::GradSquaresByUnit: the
// embedding (wte, wpe) on a stage with the embedding, one per layer, the final LayerNorm on a
// stage with the head; a head-only stage's wte is stepped by AdamW but counted by the first
// stage.
MultiTensorTable MakeMultiTensorTable(const ParamLayout& layout);
// ZeRO-1 (parallel.zero = 1): AdamW's chunks over `ranges` only, the chunk's share of the
// parameters (each range inside one tensor), every range cut into chunks of at most
// kChunkElements from its start, their moments packed back to back in the ranges' order (the
// CPU's packing, StageModel::ShardOptimizerState). No unit: the norm runs over the whole table.
std::vector<TensorChunk> MakeShareTable(const ParamLayout& layout,
                                        const std::vector<ParamRange>& ranges);
// Its length, for the memory plan.
int64_t ShareTableChunks(const std::vector<ParamRange>& ranges);
// The number of chunks MakeMultiTensorTable(layout) makes and the units it counts, for the
// memory plan.
int64_t NumTensorChunks(const ParamLayout& layout);
int64_t NumGradNormUnits(const StageSpec& stage);
// The table on the device, one planned buffer: the chunks, then unit_begin at
// UnitBeginOffsetBytes (16-byte aligned).
inline int64_t UnitBeginOffsetBytes(int64_t chunks) {
  return (chunks * static_cast<int64_t>(sizeof(TensorChunk)) + 15) / 16 * 16;
}
inline int64_t TableBytes(int64_t chunks, int64_t units) {
  return UnitBeginOffsetBytes(chunks) + (units + 1) * 4;
}

// PyTorch's AdamW on one fp32 element, exactly as the per-tensor AdamW kernel (kernels.cu)
// writes it, operation for operation, so that both give the same bits.
struct AdamWScalars {
  float lr, beta1, beta2, eps, grad_scale, bias_correction1, bias_correction2;
};
FR_HOST_DEVICE inline float AdamWElement(float master, float grad, float* m, float* v,
                                         float weight_decay, const AdamWScalars& a) {
  const float g = grad * a.grad_scale;
  const float mi = a.beta1 * *m + (1.0f - a.beta1) * g;
  const float vi = a.beta2 * *v + (1.0f - a.beta2) * g * g;
  *m = mi;
  *v = vi;
  float p = master * (1.0f - a.lr * weight_decay);
  p -= (a.lr / a.bias_correction1) * mi / (sqrtf(vi) / sqrtf(a.bias_correction2) + a.eps);
  return p;
}

}  // namespace freeride::cuda
