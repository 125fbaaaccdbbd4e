// The arithmetic of the vectorised memory-bound kernels (layernorm.cu, column_sums.cu,
// elementwise.cu), apart from them so that CPU tests run the same functions: which shapes they
// take, which columns each lane of a warp owns, and how the deterministic two-pass column sums
// split rows into chunks and combine them. Plain C++ with FR_HOST_DEVICE.
//
// Every access is one 16-byte vector (8 bf16 or 4 floats) at a column that is a multiple of the
// vector width, in rows of C elements with C a multiple of it: with 256-byte aligned buffers
// (device_memory_plan.h) every access is 16-byte aligned. Indices are 32-bit: the shapes taken
// keep every index of a [N, 4C] tensor below 2³¹.
//
// The column sums never depend on timing or on the device: the chunk count is a function of
// the shape only (sized to fill an H100's 132 SMs a few times over), each chunk sums its rows
// in order, warp by warp, the warps of a block are combined in warp order, and the second pass
// adds the chunks in chunk order.
#pragma once

#include <cstdint>

#include "models/cuda/attention_layout.h"  // FR_HOST_DEVICE

namespace freeride::cuda::vec {

inline constexpr int kVectorBytes = 16;
inline constexpr int64_t kMaxIndex = 2147483647;  // int32
inline constexpr int64_t kMaxGridY = 65535;
// Vectors a lane keeps of its row in LayerNorm forward (registers): C ≤ 32·8·width, that is
// 2048 in bf16 (every config shipped) and 1024 in fp32.
inline constexpr int kMaxVectorsPerLane = 8;
// Blocks a grid aims at: four per SM of an H100. Fixed, so that the partial sums, and so the
// results, are the same bits on any device.
inline constexpr int64_t kTargetBlocks = 4 * 132;

FR_HOST_DEVICE constexpr int Width(int element_bytes) { return kVectorBytes / element_bytes; }

// Whether the vectorised kernels take N rows of C elements (and the [N, 3C], [N, 4C] tensors of
// the same block); otherwise the reference kernels run.
FR_HOST_DEVICE constexpr bool Supported(int64_t N, int64_t C, int element_bytes) {
  const int64_t w = Width(element_bytes);
  return N > 0 && C > 0 && C % w == 0 && N * 4 * C <= kMaxIndex && C <= 32 * w * kMaxVectorsPerLane;
}

// One warp per row: lane `lane`'s k-th vector starts at this column (lanes side by side, so a
// warp reads 32 consecutive vectors at once); a lane's vectors are those below C.
FR_HOST_DEVICE constexpr int32_t LaneColumn(int lane, int k, int width) {
  return (k * 32 + lane) * width;
}
FR_HOST_DEVICE constexpr int VectorsPerLane(int64_t C, int width) {
  return static_cast<int>((C / width + 31) / 32);
}

// Element-wise kernels: one vector per thread, n a multiple of the width.
inline constexpr int kElementwiseThreads = 256;
FR_HOST_DEVICE constexpr int64_t ElementwiseBlocks(int64_t n, int width) {
  return (n / width + kElementwiseThreads - 1) / kElementwiseThreads;
}

// ---- LayerNorm forward: one warp per row ---------------------------------------------------

inline constexpr int kForwardWarps = 8;
FR_HOST_DEVICE constexpr int64_t ForwardBlocks(int64_t N) {
  return (N + kForwardWarps - 1) / kForwardWarps;
}

// ---- two-pass column sums ------------------------------------------------------------------

// A chunk of rows [begin, end) of a grid of `chunks` chunks of `rows` rows each (the last one
// shorter): the first pass's unit. Every row is in exactly one chunk; no chunk is empty.
struct RowChunks {
  int64_t chunks = 0, rows = 0;
};
FR_HOST_DEVICE constexpr RowChunks SplitRows(int64_t N, int64_t wanted, int64_t min_rows) {
  int64_t chunks = wanted < 1 ? 1 : wanted;
  const int64_t most = (N + min_rows - 1) / min_rows;  // each chunk at least min_rows rows
  if (chunks > most) chunks = most;
  if (chunks > kMaxGridY) chunks = kMaxGridY;
  const int64_t rows = (N + chunks - 1) / chunks;
  return {(N + rows - 1) / rows, rows};
}
FR_HOST_DEVICE constexpr int64_t ChunkBegin(const RowChunks& g, int64_t chunk) {
  return chunk * g.rows;
}
FR_HOST_DEVICE constexpr int64_t ChunkEnd(const RowChunks& g, int64_t chunk, int64_t N) {
  return (chunk + 1) * g.rows < N ? (chunk + 1) * g.rows : N;
}

// Column sums of x [N, C] (bias gradients): block (column tile, chunk) of kColumnWarps warps,
// each lane one vector of the tile's 32·width columns; warp w sums rows begin + w,
// begin + w + kColumnWarps, ... in order; the warps are combined in order into
// partials[chunk, C].
inline constexpr int kColumnWarps = 8;
struct ColumnGrid {
  int64_t column_tiles = 0;
  RowChunks rows;
};
FR_HOST_DEVICE constexpr ColumnGrid ColumnSumGrid(int64_t N, int64_t C, int width) {
  const int64_t tiles = (C + 32 * width - 1) / (32 * width);
  return {tiles, SplitRows(N, (kTargetBlocks + tiles - 1) / tiles, kColumnWarps)};
}

// LayerNorm backward (input and weight parts in one pass): block b of kBackwardWarps warps
// takes chunk b of the rows, warp w its rows begin + w, begin + w + kBackwardWarps, ...; each
// warp sums its rows' dout·x̂ and dout per column in two shared-memory slabs of its own, and
// the slabs are combined in warp order into partials[b, C] (weight) and partials[chunks + b, C]
// (bias).
inline constexpr int kBackwardWarps = 4;
FR_HOST_DEVICE constexpr RowChunks BackwardGrid(int64_t N) {
  return SplitRows(N, kTargetBlocks, kBackwardWarps);
}
// A slab holds a lane's columns as float4s side by side across the lanes (lane, then the
// vector's quarter, then the lane's vector k), so that a warp's 128-bit accesses to it meet no
// bank conflict; the floats of columns past C are padding, never read.
FR_HOST_DEVICE constexpr int64_t SlabFloats(int64_t C, int width) {
  return int64_t{VectorsPerLane(C, width)} * 32 * width;
}
FR_HOST_DEVICE constexpr int64_t SlabIndex(int64_t c, int width) {
  const int64_t k = c / (32 * width), lane = (c / width) % 32, quarter = (c % width) / 4;
  return ((k * (width / 4) + quarter) * 32 + lane) * 4 + c % 4;
}
FR_HOST_DEVICE constexpr int64_t BackwardSharedBytes(int64_t C, int width) {
  return kBackwardWarps * 2 * SlabFloats(C, width) * 4;
}
inline constexpr int64_t kMaxSharedBytes = 227 * 1024;  // H100's opt-in limit per block

// The second pass: dst[c] += Σ_chunk partials[chunk, c] for `count` arrays of partials laid one
// after the other (LayerNorm: weight then bias). Block (32 columns, one array) of kFinishSlices
// warps: slice s sums chunks s, s + kFinishSlices, ... in order, then the slices are added in
// order.
inline constexpr int kFinishSlices = 32;
FR_HOST_DEVICE constexpr int64_t FinishColumnBlocks(int64_t C) { return (C + 31) / 32; }

// Floats of partial sums the first passes need in a transformer block of width C over N rows
// of `element_bytes` elements: the column sums of its [N, C], [N, 3C] and [N, 4C] gradients and
// LayerNorm's two arrays, whichever is largest (they run one after the other).
FR_HOST_DEVICE constexpr int64_t ColumnPartialFloats(int64_t N, int64_t C, int width) {
  return ColumnSumGrid(N, C, width).rows.chunks * C;
}
FR_HOST_DEVICE constexpr int64_t BlockPartialFloats(int64_t N, int64_t C, int element_bytes) {
  const int w = Width(element_bytes);
  int64_t most = 2 * BackwardGrid(N).chunks * C;
  for (int64_t k = 1; k <= 4; ++k) {
    const int64_t floats = ColumnPartialFloats(N, k * C, w);
    if (floats > most) most = floats;
  }
  return most;
}

}  // namespace freeride::cuda::vec
