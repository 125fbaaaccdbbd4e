// The zero-bubble family and the V placement: every generated schedule is valid over sweeps
// of p and m (down to the smallest m each kind accepts); on uniform costs the simulated
// bubble (the papers' measure: idle time inside a stage's span, no step-end barrier) is each
// paper's closed form; peak live activations are the papers' memory claims.
#include <gtest/gtest.h>

#include "absl/strings/str_format.h"
#include "pipeline/generators.h"
#include "pipeline/simulator.h"
#include "pipeline/validator.h"
#include "tests/pipeline/schedule_builders.h"

namespace freeride::pipeline {
namespace {

// The schedule bubble (SimResult::schedule_bubble) of a generated schedule.
double Bubble(ScheduleKind kind, int p, int m, const CostModel& cost, int v = 1) {
  return MustSimulate(MustBuild(kind, p, m, v, cost), cost).schedule_bubble;
}

TEST(VPlacementTest, StagesAndVirtualStagesRoundTrip) {
  for (int p : {1, 2, 3, 5}) {
    for (int s = 0; s < p; ++s) {
      for (int c = 0; c < 4; ++c) {
        const int k = VirtualStageOf(Placement::kV, p, s, c);
        EXPECT_EQ(StageOfVirtual(Placement::kV, p, k), s);
        EXPECT_EQ(k / p, c);
      }
    }
    // The V: stage 0 holds the first and the last virtual stage of two chunks.
    EXPECT_EQ(StageOfVirtual(Placement::kV, p, 2 * p - 1), 0);
    EXPECT_EQ(StageOfVirtual(Placement::kV, p, p), p - 1);
  }
}

TEST(ZeroBubbleTest, EveryKindValidatesAcrossStagesMicrobatchesAndCosts) {
  const CostModel costs[] = {CostModel::Uniform(), CostModel::Uniform(1, 2, 1, 0.1),
                             CostModel::Uniform(2, 3, 1), CostModel::Uniform(1, 1, 2)};
  for (ScheduleKind kind : {ScheduleKind::kZBH2, ScheduleKind::kZBV, ScheduleKind::kDualPipeV}) {
    for (int p : {1, 2, 3, 4, 6}) {
      const int least = kind == ScheduleKind::kDualPipeV ? 2 * p : 1;
      for (int m = least; m <= 3 * p + 1; ++m) {
        for (const CostModel& cost : costs) {
          SCOPED_TRACE(absl::StrFormat("%s p=%d m=%d cost=%s", ScheduleKindName(kind), p, m,
                                       FormatCostModel(cost)));
          const Schedule s = MustBuild(kind, p, m, 1, cost);
          ASSERT_EQ(s.stages, p);
          EXPECT_TRUE(Validate(s).ok()) << Validate(s).message();
          EXPECT_EQ(s.placement, PlacementOf(kind));
          EXPECT_EQ(s.chunks, PlacementOf(kind) == Placement::kV ? 2 : 1);
        }
      }
    }
  }
}

TEST(ZeroBubbleTest, DualPipeVRefusesTooFewMicrobatches) {
  ScheduleOptions o;
  o.kind = ScheduleKind::kDualPipeV;
  o.stages = 4;
  o.microbatches = 7;
  absl::StatusOr<Schedule> s = BuildSchedule(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("at least 2p micro-batches"), std::string::npos);
  o.kind = ScheduleKind::kZBV;
  o.chunks = 3;
  EXPECT_FALSE(BuildSchedule(o).ok());
}

// Uniform costs f = b = w = 1 per stage (a V chunk costs half): the papers' bubbles.
TEST(ZeroBubbleTest, UniformCostBubblesAreThePapersClosedForms) {
  const CostModel cost = CostModel::Uniform();
  for (int p : {2, 3, 4, 6, 8}) {
    for (int m : {2 * p, 2 * p + 3, 4 * p}) {
      SCOPED_TRACE(absl::StrFormat("p=%d m=%d", p, m));
      // 1F1B and GPipe: (p-1)(F+B+W). Interleaved over v chunks: that over v.
      EXPECT_DOUBLE_EQ(Bubble(ScheduleKind::k1F1B, p, m, cost), 3.0 * (p - 1));
      EXPECT_DOUBLE_EQ(Bubble(ScheduleKind::kGPipe, p, m, cost), 3.0 * (p - 1));
      if (m % p == 0) {  // Megatron's interleaving needs it
        EXPECT_DOUBLE_EQ(Bubble(ScheduleKind::kInterleaved, p, m, cost, 2), 3.0 * (p - 1) / 2);
      }
      // ZB-H1: (p-1)(F+B-W), a third of 1F1B's. ZB-H2 and ZB-V: (p-1)(F+B-2W) = 0.
      EXPECT_DOUBLE_EQ(Bubble(ScheduleKind::kZBH1, p, m, cost), 1.0 * (p - 1));
      EXPECT_DOUBLE_EQ(Bubble(ScheduleKind::kZBH2, p, m, cost), 0.0);
      EXPECT_DOUBLE_EQ(Bubble(ScheduleKind::kZBV, p, m, cost), 0.0);
      // DualPipe states (PP/2-1)(F&B+B-3W): with PP/2 = p, chunk costs c = 1/2 and the
      // overlapped pair costing its backward (F&B = B = 2c), (p-1)c.
      EXPECT_DOUBLE_EQ(Bubble(ScheduleKind::kDualPipeV, p, m, cost), 0.5 * (p - 1));
    }
  }
}

TEST(ZeroBubbleTest, SmallestMicrobatchCountsThatReachZero) {
  const CostModel cost = CostModel::Uniform();
  for (int p : {2, 3, 4, 5}) {
    for (ScheduleKind kind : {ScheduleKind::kZBH2, ScheduleKind::kZBV}) {
      SCOPED_TRACE(absl::StrFormat("%s p=%d", ScheduleKindName(kind), p));
      // 2p-1 micro-batches fill the V (and ZB-H2's warm-up); one fewer leaves a bubble.
      EXPECT_DOUBLE_EQ(Bubble(kind, p, 2 * p - 1, cost), 0.0);
      EXPECT_GT(Bubble(kind, p, 2 * p - 2, cost), 0.0);
    }
  }
}

TEST(ZeroBubbleTest, NonUniformCostsKeepTheOrderOfTheFamily) {
  for (const CostModel& cost : {CostModel::Uniform(1, 2, 1), CostModel::Uniform(2, 3, 1),
                                CostModel::Uniform(1, 1, 2), CostModel::Uniform(1, 2, 1, 0.2)}) {
    for (int p : {2, 3, 4, 6}) {
      const int m = 3 * p;
      SCOPED_TRACE(absl::StrFormat("p=%d cost=%s", p, FormatCostModel(cost)));
      const StageCost& c = cost.stages[0];
      const double f1b1 = Bubble(ScheduleKind::k1F1B, p, m, cost);
      const double h1 = Bubble(ScheduleKind::kZBH1, p, m, cost);
      const double h2 = Bubble(ScheduleKind::kZBH2, p, m, cost);
      const double zbv = Bubble(ScheduleKind::kZBV, p, m, cost);
      const double dual = Bubble(ScheduleKind::kDualPipeV, p, m, cost);
      if (cost.comm == 0 && c.w <= c.f) {
        // The papers' forms where they apply (T_W <= T_F): ZB-H1 exactly, ZB-H2 and ZB-V
        // at most (p-1)(F+B-2W).
        EXPECT_DOUBLE_EQ(h1, (p - 1) * (c.f + c.b - c.w));
        EXPECT_LE(h2, (p - 1) * (c.f + c.b - 2 * c.w) + 1e-9);
        EXPECT_LE(zbv, (p - 1) * (c.f + c.b - 2 * c.w) + 1e-9);
      }
      EXPECT_LE(h1, f1b1 + 1e-9);
      EXPECT_LE(h2, h1 + 1e-9);
      EXPECT_LE(zbv, f1b1 + 1e-9);
      EXPECT_LE(dual, f1b1 + 1e-9);
    }
  }
}

// Peak micro-batch activations held (F to its B or I), per the papers: 1F1B and ZB-H1 p on
// stage 0; ZB-H2 2p-1; ZB-V 2p chunk activations, each half a stage's (1F1B's p·M_B);
// DualPipeV PP+1 = 2p+1 chunk activations.
TEST(ZeroBubbleTest, PeakActivationsAreThePapersMemoryClaims) {
  const CostModel cost = CostModel::Uniform();
  for (int p : {2, 3, 4, 6}) {
    const int m = 3 * p;
    SCOPED_TRACE(absl::StrFormat("p=%d m=%d", p, m));
    auto peak = [&](ScheduleKind kind) {
      const SimResult r = MustSimulate(MustBuild(kind, p, m, 1, cost), cost);
      int most = 0;
      for (const StageResult& s : r.stages) most = std::max(most, s.peak_activations);
      return most;
    };
    EXPECT_EQ(peak(ScheduleKind::k1F1B), p);
    EXPECT_EQ(peak(ScheduleKind::kZBH1), p);
    EXPECT_EQ(peak(ScheduleKind::kZBH2), 2 * p - 1);
    EXPECT_EQ(peak(ScheduleKind::kZBV), 2 * p);
    EXPECT_EQ(peak(ScheduleKind::kDualPipeV), 2 * p + 1);
  }
}

TEST(ZeroBubbleTest, VScheduleKeepsTheTiedEmbeddingOnStageZero) {
  const Schedule s = MustBuild(ScheduleKind::kZBV, 3, 6);
  for (const auto& stage : s.per_stage) {
    for (const Instr& in : stage) EXPECT_NE(in.op, Op::kReduceTied);  // summed on stage 0
  }
  // Labels come in on stage 0 (the last virtual stage), inputs too.
  int loads = 0;
  for (const Instr& in : s.per_stage[0]) loads += in.op == Op::kLoad;
  EXPECT_EQ(loads, 2 * 6);
  for (const Instr& in : s.per_stage[2]) EXPECT_NE(in.op, Op::kLoad);
}

}  // namespace
}  // namespace freeride::pipeline
