// nvcuda::wmma for the emulation build: 16×16×16 fragments of bf16 (or half-free fp32
// accumulators) with fp32 accumulation. The operand fragments (matrix_a, matrix_b) hold the
// whole tile in every lane, loaded when that lane executes the load; an accumulator holds only
// the lane's share, elements i ≡ lane (mod 32) of the row-major tile, and a store writes only
// that share. So a lane that loads a tile before the other lanes finished writing it computes
// with stale values, and a lane that reads a stored tile before the others stored their shares
// reads stale ones: a missing __syncwarp around a fragment shows as it would on the hardware.
// Products are exact in fp32 (bf16 × bf16) and summed in k order; the tensor core's own
// accumulation order is not modelled.
#pragma once

#include <cstddef>

#include "models/cuda/emulation/device.h"
#include "models/cuda/emulation/include/cuda_bf16.h"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {
constexpr int kTile = 16;
constexpr int kShare = kTile * kTile / 32;  // an accumulator's elements per lane
}  // namespace detail

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment;

// An operand: the whole tile, row-major [row][col] whatever its memory layout.
template <typename Use, typename T, typename Layout>
struct fragment<Use, 16, 16, 16, T, Layout> {
  static_assert(std::is_same_v<Use, matrix_a> || std::is_same_v<Use, matrix_b>);
  static constexpr int num_elements = detail::kTile * detail::kTile;
  T x[num_elements];
};

template <typename T>
struct fragment<accumulator, 16, 16, 16, T, void> {
  static constexpr int num_elements = detail::kShare;
  T x[num_elements];  // element j is the tile's element lane + 32·j
};

template <typename Use, typename T, typename Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& a, const T* p, unsigned ldm) {
  constexpr bool kRowMajor = std::is_same_v<Layout, row_major>;
  for (int r = 0; r < detail::kTile; ++r) {
    for (int c = 0; c < detail::kTile; ++c) {
      a.x[r * detail::kTile + c] = kRowMajor ? p[r * ldm + c] : p[c * ldm + r];
    }
  }
}

template <typename T>
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, T>& c, const T* p, unsigned ldm,
                             layout_t layout) {
  const int lane = ::freeride::emu::LaneId();
  for (int j = 0; j < detail::kShare; ++j) {
    const int i = lane + 32 * j, r = i / detail::kTile, col = i % detail::kTile;
    c.x[j] = layout == mem_row_major ? p[r * ldm + col] : p[col * ldm + r];
  }
}

template <typename T>
inline void store_matrix_sync(T* p, const fragment<accumulator, 16, 16, 16, T>& c, unsigned ldm,
                              layout_t layout) {
  const int lane = ::freeride::emu::LaneId();
  for (int j = 0; j < detail::kShare; ++j) {
    const int i = lane + 32 * j, r = i / detail::kTile, col = i % detail::kTile;
    (layout == mem_row_major ? p[r * ldm + col] : p[col * ldm + r]) = c.x[j];
  }
}

template <typename Frag, typename V>
inline void fill_fragment(Frag& f, const V& value) {
  for (auto& e : f.x) e = value;
}

template <typename T, typename LayoutA, typename LayoutB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
                     const fragment<matrix_a, 16, 16, 16, T, LayoutA>& a,
                     const fragment<matrix_b, 16, 16, 16, T, LayoutB>& b,
                     const fragment<accumulator, 16, 16, 16, float>& c) {
  const int lane = ::freeride::emu::LaneId();
  for (int j = 0; j < detail::kShare; ++j) {
    const int i = lane + 32 * j, r = i / detail::kTile, col = i % detail::kTile;
    float sum = c.x[j];
    for (int k = 0; k < detail::kTile; ++k) {
      sum += static_cast<float>(a.x[r * detail::kTile + k]) *
             static_cast<float>(b.x[k * detail::kTile + col]);
    }
    d.x[j] = sum;
  }
}

}  // namespace nvcuda::wmma
