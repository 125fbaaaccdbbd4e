// The flash attention's tile arithmetic (models/cuda/flash_tile.h), run on the CPU exactly as
// the kernels of flash_attention.cu walk their tiles (in float, the kernels' accumulation
// precision) and held to a float64 closed-form attention; the causal tile bounds pair by pair;
// the shared-memory layout, grid and 16-byte alignment of vector loads (against the memory
// plan's buffers) for the shapes the project trains.
#include "models/cuda/flash_tile.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "models/cuda/attention_layout.h"
#include "models/device_memory_plan.h"

namespace freeride::cuda::flash {
namespace {

struct Shape {
  int64_t B, NH, hs, T;
  int64_t C() const { return NH * hs; }
};

std::vector<double> Random(int64_t n, uint32_t seed, double scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<double> v(n);
  for (double& x : v) x = static_cast<float>(normal(rng));  // values a float holds exactly
  return v;
}

struct Result {
  std::vector<double> out, lse, dqkv;
};

// Float64 attention in closed form: P = softmax over k ≤ q of scale·q·k, O = P·V; backward
// dV = Pᵀ·dO, dP = dO·Vᵀ, dS = P ∘ (dP − rowsum(P ∘ dP)), dQ = scale·dS·K, dK = scale·dSᵀ·Q.
Result Reference(const Shape& s, const std::vector<double>& qkv, const std::vector<double>& dout) {
  const int64_t T = s.T, hs = s.hs, NH = s.NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  Result r{std::vector<double>(s.B * T * s.C()), std::vector<double>(s.B * NH * T),
           std::vector<double>(s.B * T * 3 * s.C(), 0.0)};
  auto at = [&](int64_t b, int64_t t, int64_t which, int64_t h, int64_t d) {
    return qkv[(b * T + t) * 3 * s.C() + which * s.C() + h * hs + d];
  };
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      std::vector<double> P(T * T, 0.0), dP(T * T, 0.0);
      for (int64_t q = 0; q < T; ++q) {
        double mx = -INFINITY, sum = 0;
        for (int64_t k = 0; k <= q; ++k) {
          double dot = 0;
          for (int64_t d = 0; d < hs; ++d) dot += at(b, q, 0, h, d) * at(b, k, 1, h, d);
          P[q * T + k] = scale * dot;
          mx = std::max(mx, scale * dot);
        }
        for (int64_t k = 0; k <= q; ++k) sum += std::exp(P[q * T + k] - mx);
        r.lse[(b * NH + h) * T + q] = mx + std::log(sum);
        for (int64_t k = 0; k <= q; ++k) P[q * T + k] = std::exp(P[q * T + k] - mx) / sum;
        for (int64_t d = 0; d < hs; ++d) {
          double o = 0;
          for (int64_t k = 0; k <= q; ++k) o += P[q * T + k] * at(b, k, 2, h, d);
          r.out[(b * T + q) * s.C() + h * hs + d] = o;
        }
      }
      auto dO = [&](int64_t t, int64_t d) { return dout[(b * T + t) * s.C() + h * hs + d]; };
      auto dqkv = [&](int64_t t, int64_t which, int64_t d) -> double& {
        return r.dqkv[(b * T + t) * 3 * s.C() + which * s.C() + h * hs + d];
      };
      for (int64_t q = 0; q < T; ++q) {
        double rowsum = 0;
        for (int64_t k = 0; k <= q; ++k) {
          double dot = 0;
          for (int64_t d = 0; d < hs; ++d) dot += dO(q, d) * at(b, k, 2, h, d);
          dP[q * T + k] = dot;
          rowsum += P[q * T + k] * dot;
        }
        for (int64_t k = 0; k <= q; ++k) {
          const double ds = P[q * T + k] * (dP[q * T + k] - rowsum);
          for (int64_t d = 0; d < hs; ++d) {
            dqkv(q, 0, d) += scale * ds * at(b, k, 1, h, d);
            dqkv(k, 1, d) += scale * ds * at(b, q, 0, h, d);
            dqkv(k, 2, d) += P[q * T + k] * dO(q, d);
          }
        }
      }
    }
  }
  return r;
}

// The kernels' walk in float: forward over query tiles (online softmax), backward's D, then
// dK/dV over key tiles and dQ over query tiles, each pair of tiles as the kernels do it (the
// products in float where the kernels multiply bf16 on tensor cores with fp32 accumulation).
Result Tiled(const Shape& s, const std::vector<double>& qkv64, const std::vector<double>& dout64,
             int64_t rows, int64_t cols) {
  const int64_t T = s.T, hs = s.hs, NH = s.NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const std::vector<float> qkv(qkv64.begin(), qkv64.end()), dout(dout64.begin(), dout64.end());
  std::vector<float> out(s.B * T * s.C()), lse(s.B * NH * T), D(s.B * NH * T);
  std::vector<float> dqkv(qkv.size(), 0.0f);
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      // Tiles past T read zeros, as the kernels' loads fill them.
      auto x = [&](int64_t t, int64_t which, int64_t d) {
        return t < T ? qkv[QkvIndex(b, t, which, h, d, T, NH, NH, hs)] : 0.0f;
      };
      auto dO = [&](int64_t t, int64_t d) {
        return t < T ? dout[OutIndex(b, t, h, d, T, NH, hs)] : 0.0f;
      };
      auto score = [&](int64_t q, int64_t k, int64_t a, int64_t which) {
        float sum = 0.0f;  // a = 0: q·k; a = -1: dO·v
        for (int64_t d = 0; d < hs; ++d) sum += (a == 0 ? x(q, 0, d) : dO(q, d)) * x(k, which, d);
        return sum;
      };
      for (int64_t qt = 0; qt < NumTiles(T, rows); ++qt) {
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t q = qt * rows + r;
          RowStats st;
          std::vector<float> o(hs, 0.0f), p(cols);
          for (int64_t kt = 0; kt < KeyTileEnd(qt, T, rows, cols); ++kt) {
            const bool mask = TileNeedsMask(qt, kt, T, rows, cols);
            float tile_max = -INFINITY;
            for (int64_t c = 0; c < cols; ++c) {
              const int64_t k = kt * cols + c;
              p[c] = mask && !Visible(q, k, T) ? -INFINITY : scale * score(q, k, 0, 1);
              tile_max = std::max(tile_max, p[c]);
            }
            const Rescale rs = NextMax(st.m, tile_max);
            float tile_sum = 0.0f;
            for (int64_t c = 0; c < cols; ++c) tile_sum += p[c] = ExpShifted(p[c], rs.m);
            st = {rs.m, RescaleSum(st.l, rs.alpha, tile_sum)};
            for (int64_t d = 0; d < hs; ++d) {
              float pv = 0.0f;
              for (int64_t c = 0; c < cols; ++c) pv += p[c] * x(kt * cols + c, 2, d);
              o[d] = RescaleAccumulator(o[d], rs.alpha, pv);
            }
          }
          if (q >= T) continue;
          for (int64_t d = 0; d < hs; ++d)
            out[OutIndex(b, q, h, d, T, NH, hs)] = o[d] * InverseSum(st);
          lse[StatIndex(b, h, q, T, NH)] = LogSumExp(st);
          D[StatIndex(b, h, q, T, NH)] = RowDot(&dout[OutIndex(b, q, h, 0, T, NH, hs)],
                                                &out[OutIndex(b, q, h, 0, T, NH, hs)], hs);
        }
      }
      // P and dS of one pair, as both backward kernels recompute them.
      auto pair = [&](int64_t q, int64_t k, bool mask, float* p) {
        const bool seen = !mask || Visible(q, k, T);
        const int64_t row = StatIndex(b, h, std::min(q, T - 1), T, NH);
        *p = seen ? RecomputeP(score(q, k, 0, 1), scale, lse[row]) : 0.0f;
        return seen ? SoftmaxGrad(*p, score(q, k, -1, 2), D[row]) : 0.0f;
      };
      for (int64_t kt = 0; kt < NumTiles(T, cols); ++kt) {
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t k = kt * cols + c;
          std::vector<float> dk(hs, 0.0f), dv(hs, 0.0f);
          for (int64_t qt = QueryTileBegin(kt, rows, cols); qt < NumTiles(T, rows); ++qt) {
            const bool mask = TileNeedsMask(qt, kt, T, rows, cols);
            for (int64_t r = 0; r < rows; ++r) {
              const int64_t q = qt * rows + r;
              float p;
              const float ds = pair(q, k, mask, &p);
              for (int64_t d = 0; d < hs; ++d) {
                dv[d] += p * dO(q, d);
                dk[d] += ds * x(q, 0, d);
              }
            }
          }
          if (k >= T) continue;
          for (int64_t d = 0; d < hs; ++d) {
            dqkv[QkvIndex(b, k, 1, h, d, T, NH, NH, hs)] = scale * dk[d];
            dqkv[QkvIndex(b, k, 2, h, d, T, NH, NH, hs)] = dv[d];
          }
        }
      }
      for (int64_t qt = 0; qt < NumTiles(T, rows); ++qt) {
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t q = qt * rows + r;
          std::vector<float> dq(hs, 0.0f);
          for (int64_t kt = 0; kt < KeyTileEnd(qt, T, rows, cols); ++kt) {
            const bool mask = TileNeedsMask(qt, kt, T, rows, cols);
            for (int64_t c = 0; c < cols; ++c) {
              float p;
              const float ds = pair(q, kt * cols + c, mask, &p);
              for (int64_t d = 0; d < hs; ++d) dq[d] += ds * x(kt * cols + c, 1, d);
            }
          }
          if (q >= T) continue;
          for (int64_t d = 0; d < hs; ++d)
            dqkv[QkvIndex(b, q, 0, h, d, T, NH, NH, hs)] = scale * dq[d];
        }
      }
    }
  }
  return {std::vector<double>(out.begin(), out.end()), std::vector<double>(lse.begin(), lse.end()),
          std::vector<double>(dqkv.begin(), dqkv.end())};
}

// ‖got − want‖∞ / ‖want‖∞.
double RelativeError(const std::vector<double>& got, const std::vector<double>& want) {
  double diff = 0, ref = 1e-30;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::fabs(got[i] - want[i]));
    ref = std::max(ref, std::fabs(want[i]));
  }
  return diff / ref;
}

// Float accumulation over at most a few hundred keys and 128 dimensions: float64 agrees to
// about 1e-6 of the largest element; 2e-5 leaves room and still catches any wrong rescaling,
// mask or index (those err by whole percents or more).
constexpr double kTolerance = 2e-5;

void ExpectTiledMatchesReference(const Shape& s, int64_t rows, int64_t cols) {
  // Scores of several units, so that the running max moves from tile to tile and the
  // rescaling matters.
  const auto qkv = Random(s.B * s.T * 3 * s.C(), 1 + s.T, 1.5);
  const auto dout = Random(s.B * s.T * s.C(), 2 + s.T, 1.0);
  const Result want = Reference(s, qkv, dout), got = Tiled(s, qkv, dout, rows, cols);
  SCOPED_TRACE(::testing::Message()
               << "T " << s.T << " hs " << s.hs << " tiles " << rows << "×" << cols);
  EXPECT_LT(RelativeError(got.out, want.out), kTolerance);
  EXPECT_LT(RelativeError(got.lse, want.lse), kTolerance);
  EXPECT_LT(RelativeError(got.dqkv, want.dqkv), kTolerance);
}

TEST(FlashTileTest, KernelTilesMatchFloat64AttentionForwardAndBackward) {
  for (int64_t T : {1, 17, 64, 100, 129}) {
    for (int64_t hs : {64, 16}) ExpectTiledMatchesReference({2, 2, hs, T}, kTileRows, kTileCols);
  }
}

// Head size 128 (configs/freeride_1b_*, C 2048 over 16 heads): the kernels take it, and their
// walk over its tiles is right, T within one tile, across a few and no multiple of one.
TEST(FlashTileTest, HeadSize128TilesMatchFloat64Attention) {
  for (int64_t T : {1, 17, 64, 100, 129}) {
    ASSERT_TRUE(ShapeSupported(2, 2, 128, T)) << "T " << T;
    ExpectTiledMatchesReference({2, 2, 128, T}, kTileRows, kTileCols);
  }
}

TEST(FlashTileTest, OtherTileShapesWalkTheSameAttention) {
  // Rows and columns unequal, both ways, and tiles smaller than a head's 8 dimensions.
  for (auto [rows, cols] : {std::pair{16, 32}, std::pair{32, 16}, std::pair{8, 8}}) {
    for (int64_t T : {5, 33, 70}) ExpectTiledMatchesReference({1, 2, 8, T}, rows, cols);
  }
}

// Every (q, k) pair with k ≤ q < T is visited exactly once by the forward's (and dQ's) walk
// over query tiles and once by dK/dV's walk over key tiles; no pair with k > q is ever taken;
// tiles computed without a mask hold only visible pairs; tiles not walked hold none.
TEST(FlashTileTest, CausalBoundsVisitEveryVisiblePairOnce) {
  for (auto [rows, cols] : {std::pair{64, 64}, std::pair{16, 32}, std::pair{32, 16}}) {
    for (int64_t T : {1, 15, 16, 64, 65, 200, 1024}) {
      SCOPED_TRACE(::testing::Message() << rows << "×" << cols << " T " << T);
      std::vector<int> by_query(T * T, 0), by_key(T * T, 0);
      const int64_t qtiles = NumTiles(T, rows), ktiles = NumTiles(T, cols);
      for (int64_t qt = 0; qt < qtiles; ++qt) {
        for (int64_t kt = 0; kt < ktiles; ++kt) {
          const bool forward = kt < KeyTileEnd(qt, T, rows, cols);
          const bool backward = qt >= QueryTileBegin(kt, rows, cols);
          ASSERT_EQ(forward, backward) << "tile " << qt << "," << kt;
          int visible = 0;
          for (int64_t q = qt * rows; q < (qt + 1) * rows; ++q) {
            for (int64_t k = kt * cols; k < (kt + 1) * cols; ++k) {
              if (!Visible(q, k, T)) {
                ASSERT_TRUE(!forward || TileNeedsMask(qt, kt, T, rows, cols)) << q << "," << k;
                continue;
              }
              ASSERT_LE(k, q);
              ++visible;
              if (forward) ++by_query[q * T + k];
              if (backward) ++by_key[q * T + k];
            }
          }
          if (!forward) {
            EXPECT_EQ(visible, 0) << "tile " << qt << "," << kt << " skipped";
          }
        }
      }
      for (int64_t q = 0; q < T; ++q) {
        for (int64_t k = 0; k < T; ++k) {
          ASSERT_EQ(by_query[q * T + k], k <= q ? 1 : 0) << q << "," << k;
          ASSERT_EQ(by_key[q * T + k], k <= q ? 1 : 0) << q << "," << k;
        }
      }
      // Only the diagonal band (and a partial last row of tiles) is masked.
      if (rows == cols && T % rows == 0) {
        for (int64_t qt = 0; qt < qtiles; ++qt) {
          for (int64_t kt = 0; kt < KeyTileEnd(qt, T); ++kt) {
            EXPECT_EQ(TileNeedsMask(qt, kt, T, rows, cols), kt == qt);
          }
        }
      }
    }
  }
}

TEST(FlashTileTest, MergingPartialRowsEqualsOneRunningRow) {
  const std::vector<float> x = {0.5f, -3.0f, 7.0f, 2.0f, -INFINITY, 6.5f, 1.0f};
  RowStats running, left, right;
  for (size_t i = 0; i < x.size(); ++i) {
    RowStats& part = i < 3 ? left : right;
    for (RowStats* st : {&running, &part}) {
      const Rescale rs = NextMax(st->m, x[i]);
      *st = {rs.m, RescaleSum(st->l, rs.alpha, ExpShifted(x[i], rs.m))};
    }
  }
  double want = 0;
  for (float v : x) want += std::exp(double(v));
  EXPECT_NEAR(LogSumExp(running), std::log(want), 1e-6);
  EXPECT_NEAR(LogSumExp(Merge(left, right)), std::log(want), 1e-6);
  EXPECT_NEAR(LogSumExp(Merge(RowStats{}, right)), LogSumExp(right), 1e-6);
  // A row that has seen nothing: no NaN, and nothing to write.
  EXPECT_EQ(LogSumExp(RowStats{}), -INFINITY);
  EXPECT_EQ(InverseSum(RowStats{}), 0.0f);
  EXPECT_EQ(NextMax(-INFINITY, -INFINITY).alpha, 0.0f);
}

// The fused buffer's strides name the same elements the reference path's head split moves.
TEST(FlashTileTest, QkvAndOutputStridesMatchTheReferenceLayout) {
  const int64_t B = 2, T = 5, NH = 3, hs = 4, C = NH * hs;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < NH; ++h) {
        for (int64_t d = 0; d < hs; ++d) {
          for (int64_t which = 0; which < 3; ++which) {
            EXPECT_EQ(QkvToHeadMajor(QkvIndex(b, t, which, h, d, T, NH, NH, hs), B, T, C, NH),
                      which * B * T * C + ((b * NH + h) * T + t) * hs + d);
          }
          EXPECT_EQ(OutToHeadMajor(OutIndex(b, t, h, d, T, NH, hs), T, C, NH),
                    ((b * NH + h) * T + t) * hs + d);
        }
      }
    }
  }
}

// Grouped-query attention's rows as the CPU's Llama kernels lay them out
// (models/cpu/llama_kernels.h): q heads, then NKV k heads, then NKV v heads.
TEST(FlashTileTest, GroupedQueryStridesMatchTheCpuLayout) {
  const int64_t B = 2, T = 3, NH = 4, NKV = 2, hs = 4, row = (NH + 2 * NKV) * hs;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t d = 0; d < hs; ++d) {
        for (int64_t h = 0; h < NH; ++h) {
          EXPECT_EQ(QkvIndex(b, t, 0, h, d, T, NH, NKV, hs), (b * T + t) * row + h * hs + d);
        }
        for (int64_t kv = 0; kv < NKV; ++kv) {
          EXPECT_EQ(QkvIndex(b, t, 1, kv, d, T, NH, NKV, hs),
                    (b * T + t) * row + NH * hs + kv * hs + d);
          EXPECT_EQ(QkvIndex(b, t, 2, kv, d, T, NH, NKV, hs),
                    (b * T + t) * row + (NH + NKV) * hs + kv * hs + d);
        }
      }
    }
  }
}

// The attention shapes the project trains: the GPU tests' tiny model (B 4, T 32, C 64, 4
// heads), configs/tiny_cpu.toml's (micro-batch 2, T 64, C 128, 4 heads), the side model of
// configs/freeride_1b_*.toml (C 256, 4 heads, T 256), GPT-2 124M at T 1024 over the micro-batch
// sizes bench/gpu/bench.sh runs, a T no tile divides, and head size 128: a tiny model and
// configs/freeride_1b_pp4_m4.toml's (micro-batch 12, C 2048, 16 heads, T 1024).
std::vector<Shape> ProjectShapes() {
  std::vector<Shape> shapes = {{4, 4, 16, 32}, {2, 4, 32, 64}, {8, 4, 64, 256}, {3, 12, 64, 1000}};
  for (int64_t B : {4, 8, 16, 32}) shapes.push_back({B, 12, 64, 1024});
  shapes.push_back({2, 2, 128, 100});
  shapes.push_back({12, 16, 128, 1024});
  return shapes;
}

// Each kernel's shared memory, as planned, is within the opt-in limit per block of both cards
// the CUDA tree is built for: the A100's 163 KiB (sm_80) and the H100's 227 KiB (sm_90).
TEST(FlashGeometryTest, GridAndSharedMemoryFitTheA100AndH100) {
  for (const Shape& s : ProjectShapes()) {
    SCOPED_TRACE(::testing::Message()
                 << "B " << s.B << " NH " << s.NH << " hs " << s.hs << " T " << s.T);
    EXPECT_TRUE(ShapeSupported(s.B, s.NH, s.hs, s.T));
    const Grid g = TileGrid(s.B, s.NH, s.T);
    EXPECT_EQ(g.x * kTileRows >= s.T && (g.x - 1) * kTileRows < s.T, true);
    EXPECT_EQ(g.y, s.B * s.NH);
    EXPECT_LE(g.x, kMaxGridX);
    EXPECT_LE(g.y, kMaxGridY);
    for (Kernel k : {Kernel::kForward, Kernel::kBackwardKv, Kernel::kBackwardQ}) {
      const SmemLayout L = Layout(k, s.hs);
      EXPECT_LE(L.bytes, 163 * 1024) << "A100";
      EXPECT_LE(L.bytes, 227 * 1024) << "H100";
      // The regions a kernel uses, [offset, offset + size), apart and inside the block's bytes.
      const int64_t tile = kTileRows * Bf16Pitch(s.hs) * 2;
      std::vector<std::pair<int64_t, int64_t>> regions = {
          {L.q, tile}, {L.k, tile}, {L.v, tile}, {L.scratch, kWarps * L.scratch_stride}};
      if (k != Kernel::kForward) regions.push_back({L.dout, tile});
      if (k != Kernel::kBackwardQ) regions.push_back({L.p, kWarps * L.p_stride});
      if (k != Kernel::kForward) regions.push_back({L.ds, kWarps * L.ds_stride});
      if (k == Kernel::kBackwardKv) regions.push_back({L.stats, 2 * kTileRows * 4});
      // dK/dV's dK accumulators where they are not registers: 16 rows of hs floats a warp.
      EXPECT_EQ(L.dk_stride > 0, k == Kernel::kBackwardKv && DkInShared(s.hs));
      if (L.dk_stride > 0) {
        EXPECT_GE(L.dk_stride, kWarpRows * FloatPitch(s.hs) * 4);
        EXPECT_EQ(L.dk_stride % 32, 0);
        regions.push_back({L.dk, kWarps * L.dk_stride});
      }
      std::sort(regions.begin(), regions.end());
      for (size_t i = 0; i < regions.size(); ++i) {
        EXPECT_EQ(regions[i].first % 32, 0) << "WMMA wants 256-bit aligned fragment pointers";
        if (i > 0) {
          EXPECT_GE(regions[i].first, regions[i - 1].first + regions[i - 1].second);
        }
      }
      EXPECT_LE(regions.back().first + regions.back().second, L.bytes);
      // A warp's scratch holds 16 rows of the wider of a score tile and an accumulator; its
      // P and dS tiles 16 rows of kTileCols.
      EXPECT_GE(L.scratch_stride, kWarpRows * FloatPitch(std::max<int64_t>(s.hs, kTileCols)) * 4);
      for (int64_t stride : {L.scratch_stride, L.p_stride, L.ds_stride}) EXPECT_EQ(stride % 32, 0);
      const int64_t small = kWarpRows * Bf16Pitch(kTileCols) * 2;
      EXPECT_GE(L.p_stride, k == Kernel::kBackwardQ ? 0 : small);
      EXPECT_GE(L.ds_stride, k == Kernel::kForward ? 0 : small);
    }
  }
  // Head sizes with no kernel run the reference path.
  EXPECT_FALSE(ShapeSupported(8, 8, 256, 1024));
  EXPECT_FALSE(ShapeSupported(8, 16, 96, 1024));
  EXPECT_FALSE(ShapeSupported(1, 70000, 64, 64)) << "grid y past 65535";
}

// Every fragment a warp loads or stores starts 32 bytes aligned with a legal leading dimension
// (a multiple of 8 elements for bf16, of 4 for float), at every row and column it steps to.
TEST(FlashGeometryTest, FragmentPointersAndPitchesSuitWmma) {
  for (int64_t hs : {16, 32, 64, 128}) {
    ASSERT_TRUE(HeadSizeSupported(hs));
    EXPECT_EQ(Bf16Pitch(hs) % 8, 0);
    EXPECT_EQ(Bf16Pitch(kTileCols) % 8, 0);
    EXPECT_EQ(FloatPitch(std::max<int64_t>(hs, kTileCols)) % 4, 0);
    for (int64_t row = 0; row < kTileRows; row += 16) {
      for (int64_t col = 0; col < std::max<int64_t>(hs, kTileCols); col += 16) {
        EXPECT_EQ((row * Bf16Pitch(hs) + col) * 2 % 32, 0) << "tile " << row << "," << col;
        EXPECT_EQ((col * FloatPitch(std::max<int64_t>(hs, kTileCols))) * 4 % 32, 0);
        EXPECT_EQ(col * 4 % 32, 0);
      }
    }
    EXPECT_EQ(16 * Bf16Pitch(kTileCols) * 2 % 32, 0);
    // dK's accumulators in shared memory (hs 128): fragments in rows FloatPitch(hs) apart.
    if (DkInShared(hs)) {
      EXPECT_EQ(FloatPitch(hs) % 4, 0);
    }
  }
}

// The kernels move rows in 16-byte vectors: every row of q, k, v, out and their gradients, and
// each lane's half row, must start 16 bytes aligned, in every layer's slice of the planned
// buffers (cudaMalloc gives 256), and every shared tile row too.
TEST(FlashGeometryTest, VectorLoadsAndStoresAre16ByteAligned) {
  for (const Shape& s : ProjectShapes()) {
    SCOPED_TRACE(::testing::Message() << "B " << s.B << " hs " << s.hs << " T " << s.T);
    absl::StatusOr<GPT2Config> cfg = MakeGPT2Config(3, s.NH, s.C(), s.T, 50257);
    ASSERT_TRUE(cfg.ok());
    MemoryPlan plan;
    const StageBufferIds ids = PlanStageMemory(*cfg, WholeModel(*cfg), s.B, s.T, 2, 2, &plan);
    ASSERT_TRUE(ids.flash_attention);
    const int64_t BTC = s.B * s.T * s.C();
    for (const auto& slot : ids.slots) {
      for (auto [id, per_layer] : {std::pair{slot.qkv, 3 * BTC}, std::pair{slot.dqkv, 3 * BTC},
                                   std::pair{slot.atty, BTC}}) {
        for (int64_t l = 0; l < 3; ++l) {
          EXPECT_EQ((plan.buffer(id).offset + l * per_layer * 2) % 16, 0) << plan.buffer(id).name;
        }
      }
    }
    for (int64_t b = 0; b < s.B; ++b) {
      for (int64_t t = 0; t < s.T; t += 7) {
        for (int64_t h = 0; h < s.NH; ++h) {
          for (int64_t half = 0; half < kLanesPerRow; ++half) {
            const int64_t d = half * s.hs / kLanesPerRow;
            for (int64_t which = 0; which < 3; ++which) {
              ASSERT_EQ(QkvIndex(b, t, which, h, d, s.T, s.NH, s.NH, s.hs) * 2 % 16, 0);
            }
            ASSERT_EQ(OutIndex(b, t, h, d, s.T, s.NH, s.hs) * 2 % 16, 0);
          }
        }
      }
    }
    EXPECT_EQ(Bf16Pitch(s.hs) * 2 % 16, 0);
  }
}

// configs/freeride_1b_pp4_m4.toml (bf16, micro-batch 12, T 1024, 16 heads of 128, 4 stages,
// stage 0 with its 4 activation slots) with runtime.attention = "auto": the flash path, so the
// plan reserves none of the reference path's [B, NH, T, T] buffers nor its heads split out,
// only fp32 D per row; "reference" reserves them (192 × 1M × 2 bytes each).
TEST(FlashGeometryTest, HeadSize128PlansNoTSquaredBuffers) {
  absl::StatusOr<GPT2Config> cfg = MakeGPT2Config(24, 16, 2048, 1024, 50257);
  ASSERT_TRUE(cfg.ok());
  absl::StatusOr<std::vector<StageSpec>> stages = SplitIntoStages(*cfg, 4, {});
  ASSERT_TRUE(stages.ok());
  const int64_t B = 12, T = 1024, NH = 16;
  MemoryPlan flash, reference;
  const StageBufferIds f = PlanStageMemory(*cfg, (*stages)[0], B, T, 4, 2, &flash);
  const StageBufferIds r =
      PlanStageMemory(*cfg, (*stages)[0], B, T, 4, 2, &reference, true, AttentionMode::kReference);
  ASSERT_TRUE(f.flash_attention);
  EXPECT_FALSE(r.flash_attention);
  for (int id : {f.attn_qkv, f.attn_dqkv, f.attn_probs, f.attn_scores, f.attn_y}) {
    EXPECT_EQ(flash.buffer(id).bytes, 0) << flash.buffer(id).name;
  }
  EXPECT_EQ(flash.buffer(f.attn_rowsum).bytes, B * NH * T * 4);
  EXPECT_EQ(reference.buffer(r.attn_probs).bytes, B * NH * T * T * 2);
  EXPECT_EQ(reference.buffer(r.attn_scores).bytes, B * NH * T * T * 2);
}

}  // namespace
}  // namespace freeride::cuda::flash
