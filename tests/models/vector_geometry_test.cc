// The vectorised memory-bound kernels' arithmetic (models/cuda/vector_geometry.h) on the CPU:
// the shapes they take, the columns each lane owns, a row's mean and rstd in the forward
// kernel's order, the two-pass column sums and LayerNorm's weight sums walked as the kernels
// walk them (float) against float64, the grids against the H100's limits, and 16-byte alignment
// of every access against the memory plan, for the configs shipped and the test shapes.
#include "models/cuda/vector_geometry.h"

#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "models/cuda/stage_policy.h"
#include "models/device_memory_plan.h"

namespace freeride::cuda::vec {
namespace {

struct Shape {
  int64_t N, C;
};
// GPT-2 124M (B 8 and 16, T 1024), configs/freeride_1b_* (C 2048, B 12, 8, 6), tiny_cpu (C 128,
// T 64), the GPU tests' tiny model (C 64, B 4, T 32).
std::vector<Shape> ShippedShapes() {
  return {{8 * 1024, 768},  {16 * 1024, 768}, {12 * 1024, 2048},
          {6 * 1024, 2048}, {8 * 64, 128},    {4 * 32, 64}};
}

TEST(VectorGeometryTest, ShippedConfigsTakeTheFusedKernelsInBf16) {
  for (const Shape& s : ShippedShapes()) {
    EXPECT_TRUE(Supported(s.N, s.C, 2)) << s.N << " × " << s.C;
    EXPECT_TRUE(UseFusedKernels(KernelMode::kAuto, s.N, s.C, 2));
    EXPECT_FALSE(UseFusedKernels(KernelMode::kReference, s.N, s.C, 2));
    EXPECT_EQ(Supported(s.N, s.C, 4), s.C <= 1024)
        << "fp32 keeps rows of at most 1024 in registers";
  }
  EXPECT_FALSE(Supported(8192, 100, 2)) << "C not a multiple of 8 bf16";
  EXPECT_FALSE(Supported(8192, 98, 4)) << "C not a multiple of 4 floats";
  EXPECT_FALSE(Supported(1 << 20, 1024, 2)) << "N·4C past 2³¹";
  EXPECT_FALSE(Supported(1024, 4096, 2)) << "a row too wide for a lane's registers";
}

// Each column of a row is in exactly one lane's vectors, none at or past C, and no lane needs
// more vectors than the forward kernel keeps.
TEST(VectorGeometryTest, LanesCoverEveryColumnOnce) {
  for (int bytes : {2, 4}) {
    const int w = Width(bytes);
    for (const Shape& s : ShippedShapes()) {
      if (!Supported(s.N, s.C, bytes)) continue;
      std::vector<int> seen(s.C, 0);
      for (int lane = 0; lane < 32; ++lane) {
        for (int k = 0; k < kMaxVectorsPerLane; ++k) {
          const int32_t c = LaneColumn(lane, k, w);
          if (c >= s.C) continue;
          EXPECT_LT(k, VectorsPerLane(s.C, w));
          EXPECT_EQ(c % w, 0);
          for (int i = 0; i < w; ++i) ++seen[c + i];
        }
      }
      for (int64_t c = 0; c < s.C; ++c) ASSERT_EQ(seen[c], 1) << "column " << c << " C " << s.C;
    }
  }
}

// What WarpSum leaves on every lane: the xor butterfly, each lane adding its partner's value.
std::vector<float> Butterfly(std::vector<float> v) {
  for (int o = 16; o > 0; o >>= 1) {
    std::vector<float> next(32);
    for (int lane = 0; lane < 32; ++lane) next[lane] = v[lane] + v[lane ^ o];
    v = next;
  }
  return v;
}

// A row's mean and rstd as ResidualLayerNormForwardKernel makes them (per-lane sums in vector
// order, the butterfly, then the centred variance the same way) within float rounding of
// float64, and the same bits on every lane.
TEST(VectorGeometryTest, RowStatisticsInTheKernelsOrderMatchFloat64) {
  std::mt19937 rng(3);
  std::normal_distribution<double> normal(4.0, 2.0);  // off zero: the centring matters
  for (int64_t C : {64, 128, 768, 2048}) {
    const int w = Width(2);
    std::vector<float> x(C);
    for (float& v : x) v = static_cast<float>(normal(rng));
    std::vector<float> sums(32, 0.0f), squares(32, 0.0f);
    for (int lane = 0; lane < 32; ++lane) {
      for (int k = 0; LaneColumn(lane, k, w) < C; ++k) {
        for (int i = 0; i < w; ++i) sums[lane] += x[LaneColumn(lane, k, w) + i];
      }
    }
    const std::vector<float> total = Butterfly(sums);
    for (int lane = 1; lane < 32; ++lane) ASSERT_EQ(total[lane], total[0]);
    const float m = total[0] / C;
    for (int lane = 0; lane < 32; ++lane) {
      for (int k = 0; LaneColumn(lane, k, w) < C; ++k) {
        for (int i = 0; i < w; ++i) {
          const float d = x[LaneColumn(lane, k, w) + i] - m;
          squares[lane] += d * d;
        }
      }
    }
    const std::vector<float> var = Butterfly(squares);
    for (int lane = 1; lane < 32; ++lane) ASSERT_EQ(var[lane], var[0]);
    const float rstd = 1.0f / std::sqrt(var[0] / C + 1e-5f);
    double mean64 = 0, var64 = 0;
    for (float v : x) mean64 += v;
    mean64 /= C;
    for (float v : x) var64 += (v - mean64) * (v - mean64);
    const double rstd64 = 1.0 / std::sqrt(var64 / C + 1e-5);
    EXPECT_NEAR(m, mean64, 1e-6 * std::abs(mean64)) << "C " << C;
    EXPECT_NEAR(rstd, rstd64, 1e-5 * rstd64) << "C " << C;
  }
}

// ColumnSums walked as its kernels walk it: block (tile, chunk), warp w's rows in order, the
// warps in order, then the second pass's slices in order and the slices in order.
std::vector<float> TwoPassColumnSums(const std::vector<float>& x, int64_t N, int64_t C, int w) {
  const ColumnGrid g = ColumnSumGrid(N, C, w);
  std::vector<float> partials(g.rows.chunks * C, 0.0f);
  for (int64_t chunk = 0; chunk < g.rows.chunks; ++chunk) {
    for (int64_t tile = 0; tile < g.column_tiles; ++tile) {
      for (int64_t j = 0; j < 32 * w; ++j) {
        const int64_t c = tile * 32 * w + j;
        if (c >= C) continue;
        float total = 0.0f;
        for (int warp = 0; warp < kColumnWarps; ++warp) {
          float sum = 0.0f;
          for (int64_t n = ChunkBegin(g.rows, chunk) + warp; n < ChunkEnd(g.rows, chunk, N);
               n += kColumnWarps) {
            sum += x[n * C + c];
          }
          total += sum;
        }
        partials[chunk * C + c] = total;
      }
    }
  }
  std::vector<float> out(C);
  for (int64_t c = 0; c < C; ++c) {
    float total = 0.0f;
    for (int slice = 0; slice < kFinishSlices; ++slice) {
      float sum = 0.0f;
      for (int64_t k = slice; k < g.rows.chunks; k += kFinishSlices) sum += partials[k * C + c];
      total += sum;
    }
    out[c] = total;
  }
  return out;
}

TEST(VectorGeometryTest, TwoPassColumnSumsCountEveryRowOnceAndMatchFloat64) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int bytes : {2, 4}) {
    const int w = Width(bytes);
    for (Shape s : {Shape{8192, 768}, Shape{8192, 2304}, Shape{8192, 3072}, Shape{128, 64},
                    Shape{128, 256}, Shape{512, 384}, Shape{100, 8}}) {
      SCOPED_TRACE(::testing::Message() << s.N << " × " << s.C << " width " << w);
      // Ones: every row counted exactly once gives exactly N (float holds it).
      const std::vector<float> ones =
          TwoPassColumnSums(std::vector<float>(s.N * s.C, 1.0f), s.N, s.C, w);
      for (int64_t c = 0; c < s.C; ++c) ASSERT_EQ(ones[c], static_cast<float>(s.N)) << c;
      std::vector<float> x(s.N * s.C);
      for (float& v : x) v = normal(rng);
      const std::vector<float> got = TwoPassColumnSums(x, s.N, s.C, w);
      for (int64_t c = 0; c < s.C; c += 7) {
        double want = 0, magnitude = 0;
        for (int64_t n = 0; n < s.N; ++n) {
          want += x[n * s.C + c];
          magnitude += std::abs(x[n * s.C + c]);
        }
        ASSERT_NEAR(got[c], want, 1e-6 * magnitude) << "column " << c;
      }
    }
  }
}

TEST(VectorGeometryTest, SlabIndexIsTheKernelsFloat4LayoutAndOneToOne) {
  for (int w : {Width(2), Width(4)}) {
    for (int64_t C : {64, 128, 768, 1024, 2048, 8, 264}) {
      if (C % w != 0) continue;
      std::set<int64_t> used;
      for (int64_t c = 0; c < C; ++c) {
        const int64_t at = SlabIndex(c, w);
        EXPECT_LT(at, SlabFloats(C, w));
        EXPECT_TRUE(used.insert(at).second) << "C " << C << " column " << c;
      }
      for (int lane = 0; lane < 32; ++lane) {
        for (int k = 0; LaneColumn(lane, k, w) < C; ++k) {
          for (int q = 0; q < w / 4; ++q) {
            for (int e = 0; e < 4; ++e) {
              ASSERT_EQ(SlabIndex(LaneColumn(lane, k, w) + 4 * q + e, w),
                        ((k * (w / 4) + q) * 32 + lane) * 4 + e);
            }
          }
        }
      }
    }
  }
}

// LayerNorm backward's weight part walked as LayerNormBackwardKernel and the second pass walk
// it: with dout·x̂ = 1 and dout = 1 every row must count once in both sums.
TEST(VectorGeometryTest, LayerNormBackwardChunksCountEveryRowOnce) {
  for (int64_t N : {int64_t{8192}, int64_t{12288}, int64_t{128}, int64_t{5}, int64_t{1000}}) {
    const RowChunks g = BackwardGrid(N);
    std::vector<int> seen(N, 0);
    for (int64_t b = 0; b < g.chunks; ++b) {
      EXPECT_LT(ChunkBegin(g, b), ChunkEnd(g, b, N)) << "empty chunk " << b;
      for (int warp = 0; warp < kBackwardWarps; ++warp) {
        for (int64_t n = ChunkBegin(g, b) + warp; n < ChunkEnd(g, b, N); n += kBackwardWarps) {
          ++seen[n];
        }
      }
    }
    for (int64_t n = 0; n < N; ++n) ASSERT_EQ(seen[n], 1) << "N " << N << " row " << n;
  }
}

// Grids within CUDA's limits, enough blocks to fill an H100's 132 SMs for GPT-2 124M's shapes,
// shared memory within the H100's, element-wise indices inside 32 bits.
TEST(VectorGeometryTest, GridsFitTheH100AndFillIt) {
  for (int bytes : {2, 4}) {
    const int w = Width(bytes);
    for (const Shape& s : ShippedShapes()) {
      if (!Supported(s.N, s.C, bytes)) continue;
      for (int64_t k : {1, 3, 4}) {
        const ColumnGrid g = ColumnSumGrid(s.N, k * s.C, w);
        EXPECT_LE(g.rows.chunks, kMaxGridY);
        EXPECT_GE(g.rows.chunks * g.rows.rows, s.N);
        EXPECT_LT((g.rows.chunks - 1) * g.rows.rows, s.N) << "an empty chunk";
        EXPECT_GE(g.column_tiles * 32 * w, k * s.C);
        if (s.N >= 8192) {
          EXPECT_GE(g.column_tiles * g.rows.chunks, 132) << k * s.C;
        }
        const int64_t n = s.N * k * s.C;
        EXPECT_GE(ElementwiseBlocks(n, w) * kElementwiseThreads * w, n);
        EXPECT_LT(ElementwiseBlocks(n, w) * kElementwiseThreads * w, int64_t{1} << 32);
      }
      const RowChunks b = BackwardGrid(s.N);
      if (s.N >= 8192) {
        EXPECT_GE(b.chunks, 132);
      }
      EXPECT_LE(BackwardSharedBytes(s.C, w), kMaxSharedBytes);
      EXPECT_LE(ForwardBlocks(s.N), kMaxIndex);
      EXPECT_LE(FinishColumnBlocks(4 * s.C), kMaxIndex);
    }
  }
}

// The memory plan's partials hold every first pass's, and every buffer the fused kernels read
// or write, in every layer, and every row of it, starts 16 bytes aligned; so does each
// LayerNorm weight and bias of every layer in the parameters, for whole models and pipeline
// stages.
TEST(VectorGeometryTest, PlannedBuffersHoldThePartialsAndAreAligned) {
  struct Model {
    int64_t L, NH, C, T, B;
  };
  for (const Model& m : {Model{12, 12, 768, 1024, 8}, Model{24, 16, 2048, 1024, 12},
                         Model{4, 4, 128, 64, 8}, Model{2, 4, 64, 32, 4}}) {
    // A small vocabulary, so that the head's logits do not size the partials alone.
    absl::StatusOr<GPT2Config> cfg = MakeGPT2Config(m.L, m.NH, m.C, m.T, 1000);
    ASSERT_TRUE(cfg.ok());
    absl::StatusOr<std::vector<StageSpec>> stages = SplitIntoStages(*cfg, m.L >= 4 ? 4 : 2, {});
    ASSERT_TRUE(stages.ok()) << stages.status();
    stages->push_back(WholeModel(*cfg));
    for (int bytes : {2, 4}) {
      const int64_t BT = m.B * m.T, C = m.C, BTC = BT * C;
      if (!Supported(BT, C, bytes)) continue;
      for (const StageSpec& stage : *stages) {
        SCOPED_TRACE(::testing::Message() << "C " << C << " bytes " << bytes << " layers "
                                          << stage.first_layer << ".." << stage.last_layer);
        MemoryPlan plan;
        const StageBufferIds ids = PlanStageMemory(*cfg, stage, m.B, m.T, 2, bytes, &plan);
        const int64_t partial_floats = plan.buffer(ids.column_partials).bytes / 4;
        EXPECT_GE(partial_floats, 2 * BackwardGrid(BT).chunks * C);
        for (int64_t k : {1, 3, 4}) {
          EXPECT_GE(partial_floats, ColumnPartialFloats(BT, k * C, Width(bytes)));
        }
        EXPECT_EQ(C * bytes % kVectorBytes, 0) << "rows start aligned";
        const int64_t L = stage.num_layers();
        for (const auto& s : ids.slots) {
          for (auto [id, per_layer] :
               {std::pair{s.ln1, BTC}, std::pair{s.residual2, BTC}, std::pair{s.ln2, BTC},
                std::pair{s.residual3, BTC}, std::pair{s.fch, 4 * BTC},
                std::pair{s.fch_gelu, 4 * BTC}, std::pair{s.dres3, BTC}, std::pair{s.dres2, BTC},
                std::pair{s.dln2, BTC}, std::pair{s.dln1, BTC}, std::pair{s.dfch, 4 * BTC},
                std::pair{s.dqkv, 3 * BTC}}) {
            for (int64_t l = 0; l < L; ++l) {
              ASSERT_EQ((plan.buffer(id).offset + l * per_layer * bytes) % kVectorBytes, 0)
                  << plan.buffer(id).name << " layer " << l;
            }
          }
          for (int id : {s.input, s.dinput}) EXPECT_EQ(plan.buffer(id).offset % kVectorBytes, 0);
        }
        for (int id : {ids.scratch_c, ids.scratch_4c}) {
          EXPECT_EQ(plan.buffer(id).offset % kVectorBytes, 0);
        }
        const ParamLayout layout = MakeParamLayout(*cfg, stage);
        const int params = bytes == 2 ? ids.compute : ids.master;
        for (ParamTensor t :
             {ParamTensor::kLn1W, ParamTensor::kLn1B, ParamTensor::kLn2W, ParamTensor::kLn2B}) {
          for (int64_t l = 0; l < L; ++l) {
            ASSERT_EQ((plan.buffer(params).offset + (layout.slot(t).offset + l * C) * bytes) %
                          kVectorBytes,
                      0)
                << "parameter tensor " << static_cast<int>(t) << " layer " << l;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace freeride::cuda::vec
