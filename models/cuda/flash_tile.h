// The arithmetic of the tiled ("flash") attention, apart from the kernels that run it
// (flash_attention.cu) so that the CPU tests run the very same functions over whole tile grids
// against float64 attention: which key tiles a query tile visits under the causal mask, the
// online softmax (running max and sum, the rescaling of the output accumulator), the backward's
// probabilities recomputed from each row's log-sum-exp and dS = P ∘ (dP − D), the strides by
// which Q, K, V are read straight from the fused qkv buffer [B, T, 3, NH, hs] and the output
// written as [B, T, C], and the shared-memory layout and launch geometry of each kernel.
//
// Conventions: x = scale · q·k is what the softmax sees; a row's lse = log Σ_k exp(x_k) over
// its visible keys (k ≤ q < T); row (b, h, t) of the statistics is (b·NH + h)·T + t, as the
// reference path's CausalSoftmaxForward keeps them.
#pragma once

#include <cmath>
#include <cstdint>

#include "models/cuda/attention_layout.h"  // FR_HOST_DEVICE

namespace freeride::cuda::flash {

// Query rows and key columns per tile, warps per block (each warp owns 16 rows of the tile:
// one WMMA fragment high), threads per block.
inline constexpr int kTileRows = 64;
inline constexpr int kTileCols = 64;
inline constexpr int kWarps = 4;
inline constexpr int kThreads = 32 * kWarps;
inline constexpr int kWarpRows = kTileRows / kWarps;  // 16
// Each lane owns half of one of its warp's 16 rows: row lane / 2, columns from (lane % 2)·n/2.
inline constexpr int kLanesPerRow = 2;

// Head sizes the kernels are instantiated for: multiples of a WMMA fragment's 16 up to 64,
// GPT-2's at every size, and 128 (configs/freeride_1b_*, most larger models).
FR_HOST_DEVICE constexpr bool HeadSizeSupported(int64_t hs) {
  return hs == 16 || hs == 32 || hs == 64 || hs == 128;
}

// Where the dK/dV kernel sums dK: in registers (WMMA fragments) up to hs 64; above, in a
// per-warp fp32 region of shared memory [16, hs], one fragment at a time moving through
// registers. At hs 128 the two register accumulators alone take 128 registers a thread and
// ptxas spills (656 bytes of stack on sm_90), while smaller tiles would not help (a warp's
// accumulators are [16, hs] whatever the tile) and splitting the head dimension across blocks
// recomputes S and dP twice (1.5× the kernel's products). dV stays in registers, so the
// kernel needs as many as at hs 64; the price is 33 KiB more shared memory (153 KiB in all,
// within the A100's 163) and an fp32 read and write of each dK fragment per query tile.
FR_HOST_DEVICE constexpr bool DkInShared(int64_t hs) { return hs > 64; }

FR_HOST_DEVICE constexpr int64_t NumTiles(int64_t n, int64_t tile) { return (n + tile - 1) / tile; }

// ---- causal tile bounds ------------------------------------------------------------------

// Key tiles [0, end) that query tile `qt` visits: every key at or before the tile's last row
// (min(T, (qt+1)·rows) − 1); tiles wholly above the diagonal are never visited.
FR_HOST_DEVICE constexpr int64_t KeyTileEnd(int64_t qt, int64_t T, int64_t rows = kTileRows,
                                            int64_t cols = kTileCols) {
  const int64_t last_row = ((qt + 1) * rows < T ? (qt + 1) * rows : T) - 1;
  return last_row / cols + 1;
}
// The first query tile that sees key tile `kt` (backward walks query tiles [begin, NumTiles)).
FR_HOST_DEVICE constexpr int64_t QueryTileBegin(int64_t kt, int64_t rows = kTileRows,
                                                int64_t cols = kTileCols) {
  return kt * cols / rows;
}
// Whether a query may attend to a key: causal, and the query a real row (tiles past T are
// padded with zero rows whose results are never written).
FR_HOST_DEVICE constexpr bool Visible(int64_t q, int64_t k, int64_t T) { return k <= q && q < T; }
// Whether tile (qt, kt) holds any pair that is not Visible: the diagonal tiles and the last,
// partial, query tile; every other visited tile is computed without a mask.
FR_HOST_DEVICE constexpr bool TileNeedsMask(int64_t qt, int64_t kt, int64_t T,
                                            int64_t rows = kTileRows, int64_t cols = kTileCols) {
  return (kt + 1) * cols - 1 > qt * rows || (qt + 1) * rows > T;
}

// ---- online softmax ----------------------------------------------------------------------

// A row's running statistics over the key tiles seen so far: max m of x, and l = Σ exp(x − m).
struct RowStats {
  float m = -INFINITY;
  float l = 0.0f;
};

// exp(x − m), 0 where the row has seen nothing visible yet (m = −∞; a masked x is −∞ too).
FR_HOST_DEVICE inline float ExpShifted(float x, float m) {
  return m == -INFINITY ? 0.0f : expf(x - m);
}

// The new running max after a tile whose visible maximum is `tile_max`, and the factor the
// previous sum and output accumulator are rescaled by (exp(m_old − m_new); 0 before any key).
struct Rescale {
  float m, alpha;
};
FR_HOST_DEVICE inline Rescale NextMax(float m_old, float tile_max) {
  const float m = m_old > tile_max ? m_old : tile_max;
  return {m, ExpShifted(m_old, m)};
}
// l ← α·l + Σ p over the tile (p = ExpShifted(x, m_new)); the accumulator o ← α·o + p·V.
FR_HOST_DEVICE inline float RescaleSum(float l_old, float alpha, float tile_sum) {
  return alpha * l_old + tile_sum;
}
FR_HOST_DEVICE inline float RescaleAccumulator(float o_old, float alpha, float pv) {
  return alpha * o_old + pv;
}
// Two partial states of the same row (disjoint key sets) as one: what NextMax/RescaleSum do
// tile by tile, for states built apart.
FR_HOST_DEVICE inline RowStats Merge(RowStats a, RowStats b) {
  const float m = a.m > b.m ? a.m : b.m;
  return {m, ExpShifted(a.m, m) * a.l + ExpShifted(b.m, m) * b.l};
}
// At the end of the row: the output is o / l, and the row's log-sum-exp for backward
// (−∞ and 0 for a row with nothing visible, a padded row: never written).
FR_HOST_DEVICE inline float InverseSum(RowStats s) { return s.l > 0.0f ? 1.0f / s.l : 0.0f; }
FR_HOST_DEVICE inline float LogSumExp(RowStats s) {
  return s.l > 0.0f ? s.m + logf(s.l) : -INFINITY;
}

// ---- backward ----------------------------------------------------------------------------

// D = Σ_d dO ∘ O of one row: the softmax's backward needs Σ_k P·dP, which equals it.
template <typename A, typename B>
FR_HOST_DEVICE inline float RowDot(const A* dout, const B* out, int n) {
  float sum = 0.0f;
  for (int d = 0; d < n; ++d) sum += static_cast<float>(dout[d]) * static_cast<float>(out[d]);
  return sum;
}
// P of a visible pair again, from its score and the row's log-sum-exp.
FR_HOST_DEVICE inline float RecomputeP(float score, float scale, float lse) {
  return expf(scale * score - lse);
}
// Gradient of x = scale·score: dS = P ∘ (dP − D); dQ = scale · dS·K, dK = scale · dSᵀ·Q.
FR_HOST_DEVICE inline float SoftmaxGrad(float p, float dp, float D) { return p * (dp - D); }

// ---- where the elements are --------------------------------------------------------------

// Element d of query head h's q (which = 0), or of key/value head h's k (1) or v (2), at
// position t of sequence b, in the fused qkv buffer the qkv projection writes: rows
// [q (NH·hs), k (NKV·hs), v (NKV·hs)], (NH + 2·NKV)·hs apart (grouped-query attention; GPT-2's
// [B, T, 3, NH, hs] is NKV = NH).
FR_HOST_DEVICE constexpr int64_t QkvIndex(int64_t b, int64_t t, int64_t which, int64_t h, int64_t d,
                                          int64_t T, int64_t NH, int64_t NKV, int64_t hs) {
  const int64_t head = which == 0 ? h : NH + (which - 1) * NKV + h;
  return (b * T + t) * (NH + 2 * NKV) * hs + head * hs + d;
}
// Element d of head h at (b, t) in the output [B, T, C] (and its gradient); rows C apart.
FR_HOST_DEVICE constexpr int64_t OutIndex(int64_t b, int64_t t, int64_t h, int64_t d, int64_t T,
                                          int64_t NH, int64_t hs) {
  return (b * T + t) * NH * hs + h * hs + d;
}
FR_HOST_DEVICE constexpr int64_t StatIndex(int64_t b, int64_t h, int64_t t, int64_t T, int64_t NH) {
  return (b * NH + h) * T + t;
}

// ---- shared memory -----------------------------------------------------------------------

// Row pitch (elements) of a bf16 tile of width n in shared memory: 8 elements (16 bytes) of
// padding against bank conflicts, keeping rows 16-byte aligned for vector stores; a float
// tile's pitch pads by 4.
FR_HOST_DEVICE constexpr int64_t Bf16Pitch(int64_t n) { return n + 8; }
FR_HOST_DEVICE constexpr int64_t FloatPitch(int64_t n) { return n + 4; }

// Byte offsets of each kernel's regions in its dynamic shared memory. Tiles shared by the block
// ([rows, hs] bf16: q, k, v, dO) and, per warp, a float scratch of 16 rows (scores, dP, a
// product before it joins the accumulator) and bf16 tiles of 16 rows (P, dS) that feed the
// next product. Regions absent from a kernel are left at offset 0 with no bytes.
struct SmemLayout {
  int64_t q = 0, k = 0, v = 0, dout = 0;  // block tiles
  int64_t scratch = 0, p = 0, ds = 0;     // per-warp regions: warp w's at offset + w·stride
  int64_t scratch_stride = 0, p_stride = 0, ds_stride = 0;
  int64_t stats = 0;  // dK/dV's: the query tile's lse and D, kTileRows floats each
  int64_t dk = 0, dk_stride = 0;  // dK/dV's where DkInShared: warp w's [16, hs] fp32 dK
  int64_t bytes = 0;
};
enum class Kernel { kForward, kBackwardKv, kBackwardQ };

FR_HOST_DEVICE constexpr int64_t AlignUp(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

FR_HOST_DEVICE constexpr SmemLayout Layout(Kernel kernel, int64_t hs) {
  constexpr int64_t kAlign = 128;  // WMMA needs 32-byte aligned fragment pointers
  const int64_t tile = AlignUp(kTileRows * Bf16Pitch(hs) * 2, kAlign);
  const int64_t wide = hs > kTileCols ? hs : kTileCols;
  const int64_t scratch = AlignUp(kWarpRows * FloatPitch(wide) * 4, kAlign);
  const int64_t small = AlignUp(kWarpRows * Bf16Pitch(kTileCols) * 2, kAlign);
  SmemLayout s;
  int64_t at = 0;
  s.q = at, at += tile;
  s.k = at, at += tile;
  s.v = at, at += tile;
  if (kernel != Kernel::kForward) s.dout = at, at += tile;
  s.scratch_stride = scratch;
  s.scratch = at, at += kWarps * scratch;
  if (kernel != Kernel::kBackwardQ) s.p_stride = small, s.p = at, at += kWarps * small;
  if (kernel != Kernel::kForward) s.ds_stride = small, s.ds = at, at += kWarps * small;
  if (kernel == Kernel::kBackwardKv) s.stats = at, at += AlignUp(2 * kTileRows * 4, kAlign);
  if (kernel == Kernel::kBackwardKv && DkInShared(hs)) {
    s.dk_stride = AlignUp(kWarpRows * FloatPitch(hs) * 4, kAlign);
    s.dk = at, at += kWarps * s.dk_stride;
  }
  s.bytes = at;
  return s;
}

// ---- launch geometry ---------------------------------------------------------------------

// Blocks: x = tile (query tiles for forward and dQ, key tiles for dK/dV), y = b·NH + h.
struct Grid {
  int64_t x = 0, y = 0;
};
FR_HOST_DEVICE constexpr Grid TileGrid(int64_t B, int64_t NH, int64_t T) {
  return {NumTiles(T, kTileRows), B * NH};
}
// CUDA's limits (grid y ≤ 65535, x ≤ 2³¹ − 1) and the opt-in shared memory per block of the
// H100 (sm_90) and the A100 (sm_80); the kernels fit the smaller, so both cards take them.
inline constexpr int64_t kMaxGridX = 2147483647, kMaxGridY = 65535;
inline constexpr int64_t kMaxSmemPerBlockSm90 = 227 * 1024;
inline constexpr int64_t kMaxSmemPerBlockSm80 = 163 * 1024;
inline constexpr int64_t kDefaultSmemPerBlock = 48 * 1024;  // above it, the kernel opts in

// Whether the kernels take these shapes (the stage runs the reference path otherwise): a head
// size they are built for, C a multiple of 8 so every row starts 16 bytes aligned for vector
// loads, a grid within CUDA's limits and each kernel's shared memory within both cards'. Any T.
FR_HOST_DEVICE constexpr bool ShapeSupported(int64_t B, int64_t NH, int64_t hs, int64_t T) {
  const Grid g = TileGrid(B, NH, T);
  return HeadSizeSupported(hs) && (NH * hs) % 8 == 0 && T > 0 && g.x <= kMaxGridX &&
         g.y <= kMaxGridY && Layout(Kernel::kForward, hs).bytes <= kMaxSmemPerBlockSm80 &&
         Layout(Kernel::kBackwardKv, hs).bytes <= kMaxSmemPerBlockSm80 &&
         Layout(Kernel::kBackwardQ, hs).bytes <= kMaxSmemPerBlockSm80;
}

}  // namespace freeride::cuda::flash
