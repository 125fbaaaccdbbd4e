// Generators against closed-form results: sweeps that every schedule validates and simulates,
// the bubble fractions of GPipe, 1F1B, interleaved 1F1B and ZB-H1, buffer counts, refusals.
#include "pipeline/generators.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipeline/simulator.h"
#include "pipeline/validator.h"
#include "tests/pipeline/schedule_builders.h"

namespace freeride::pipeline {
namespace {

using testing::HasSubstr;

constexpr ScheduleKind kKinds[] = {ScheduleKind::kGPipe, ScheduleKind::k1F1B,
                                   ScheduleKind::kInterleaved, ScheduleKind::kZBH1};

SimResult MustSimulate(const ScheduleOptions& o) {
  absl::StatusOr<Schedule> s = BuildSchedule(o);
  EXPECT_TRUE(s.ok()) << s.status();
  absl::StatusOr<SimResult> sim = Simulate(*s, o.cost);
  EXPECT_TRUE(sim.ok()) << sim.status();
  return *sim;
}

TEST(GeneratorsTest, SweepEveryKindValidatesAndSimulates) {
  int built = 0, refused = 0;
  for (ScheduleKind kind : kKinds) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = 1; m <= 16; ++m) {
        for (int v : {1, 2, 4}) {
          for (const CostModel& cost : {CostModel::Uniform(), CostModel::Uniform(1, 2, 0.5, 0.1)}) {
            ScheduleOptions o = Options(kind, p, m, v, cost);
            absl::StatusOr<Schedule> s = BuildSchedule(o);
            const bool interleaved = kind == ScheduleKind::kInterleaved;
            const bool expected_ok = interleaved ? (v >= 2 && m % p == 0) : v == 1;
            ASSERT_EQ(s.ok(), expected_ok) << ScheduleKindName(kind) << " p=" << p << " m=" << m
                                           << " v=" << v << ": " << s.status();
            if (!s.ok()) {
              ++refused;
              continue;
            }
            ++built;
            ASSERT_TRUE(Validate(*s).ok()) << ScheduleKindName(kind) << " p=" << p << " m=" << m
                                           << " v=" << v << "\n" << Validate(*s).message();
            absl::StatusOr<SimResult> sim = Simulate(*s, cost);
            ASSERT_TRUE(sim.ok()) << sim.status();
            for (const StageResult& r : sim->stages) {
              // Busy time is the stage's work whatever the order; the rest of the step is bubble.
              const StageCost& c = cost.Stage(r.stage);
              EXPECT_NEAR(r.busy, m * (c.f + c.b + c.w), 1e-9);
              EXPECT_NEAR(r.busy + r.bubble, sim->step_time, 1e-9);
            }
          }
        }
      }
    }
  }
  EXPECT_GT(built, 700);
  EXPECT_GT(refused, 0);
}

TEST(GeneratorsTest, GPipeAnd1F1BBubbleFractionIsClosedForm) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = 1; m <= 16; ++m) {
        for (const CostModel& cost : {CostModel::Uniform(), CostModel::Uniform(1, 2, 0.5)}) {
          SimResult sim = MustSimulate(Options(kind, p, m, 1, cost));
          EXPECT_NEAR(sim.bubble_fraction, (p - 1.0) / (m + p - 1.0), 1e-12)
              << ScheduleKindName(kind) << " p=" << p << " m=" << m;
        }
      }
    }
  }
}

TEST(GeneratorsTest, InterleavedBubbleOverIdealIsPMinusOneOverVM) {
  for (int p = 1; p <= 8; ++p) {
    for (int v : {2, 3, 4}) {
      for (int m = p; m <= 16; m += p) {
        SimResult sim = MustSimulate(Options(ScheduleKind::kInterleaved, p, m, v));
        const double ideal = m * 3.0;  // f + b + w per micro-batch, whole stage
        for (const StageResult& r : sim.stages) {
          EXPECT_NEAR(r.bubble / ideal, (p - 1.0) / (v * m), 1e-12)
              << "p=" << p << " m=" << m << " v=" << v << " stage " << r.stage;
        }
      }
    }
  }
}

// Per-chunk costs (CostModel::chunks): equal to 1/v of the stage's they change nothing;
// otherwise each chunk's compute takes its own time, and a wrong count is refused.
TEST(GeneratorsTest, ChunkCostsTimeEachChunkOnItsOwn) {
  const int p = 2, v = 2, m = 4;
  const ScheduleOptions even = Options(ScheduleKind::kInterleaved, p, m, v,
                                       CostModel::Uniform(2, 2, 2));
  ScheduleOptions split = even;
  split.cost.chunks.assign(p * v, StageCost{1, 1, 1});
  const SimResult a = MustSimulate(even), b = MustSimulate(split);
  EXPECT_DOUBLE_EQ(a.step_time, b.step_time);
  // Stage 0's second chunk 3× its first (the same stage total, f: 1 + 3 = 4 → 2 + 2 before):
  // the step changes, and stage 0 computes 4·m per op kind in all.
  ScheduleOptions skewed = even;
  skewed.cost.chunks = {{1, 1, 1}, {2, 2, 2}, {3, 3, 3}, {2, 2, 2}};
  const SimResult c = MustSimulate(skewed);
  EXPECT_NE(c.step_time, a.step_time);
  EXPECT_NEAR(c.stages[0].busy, 3.0 * 4 * m, 1e-9);  // (f + b + w) of both chunks, m times
  skewed.cost.chunks.pop_back();
  absl::StatusOr<Schedule> s = BuildSchedule(skewed);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("3 chunk entries; expected 4"));
}

TEST(GeneratorsTest, ZeroBubbleH1LeavesAThirdOf1F1BsBubble) {
  for (int p = 2; p <= 8; ++p) {
    for (int m = p; m <= 16; ++m) {
      const SimResult zero_bubble = MustSimulate(Options(ScheduleKind::kZBH1, p, m));
      const double zb = zero_bubble.bubble_fraction * zero_bubble.step_time;
      const SimResult one = MustSimulate(Options(ScheduleKind::k1F1B, p, m));
      // ZB-H1's bubble per stage (p-1)(T_F + T_B - T_W) against 1F1B's (p-1)(T_F + T_B + T_W).
      EXPECT_NEAR(zb, (p - 1.0), 1e-9) << "p=" << p << " m=" << m;
      EXPECT_NEAR(zb / (one.bubble_fraction * one.step_time), 1.0 / 3.0, 1e-9);
    }
  }
}

TEST(GeneratorsTest, OneFOneBUsesMinOfStagesLeftAndMicrobatchesBuffers) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 12; ++m) {
      absl::StatusOr<Schedule> s = BuildSchedule(Options(ScheduleKind::k1F1B, p, m));
      ASSERT_TRUE(s.ok());
      for (int st = 0; st < p; ++st) {
        EXPECT_EQ(s->buffers_per_stage[st], std::min(p - st, m));
        int warmup = 0;  // forwards before the first backward: Megatron's min(p-s-1, m) + 1
        for (const Instr& in : s->per_stage[st]) {
          if (IsBackward(in.op)) break;
          warmup += in.op == Op::kForward;
        }
        EXPECT_EQ(warmup, std::min(p - st - 1, m) + (m > p - st - 1 ? 1 : 0));
      }
    }
  }
}

TEST(GeneratorsTest, BubblesCarryKindsInTheOrderTheyHappen) {
  SimResult sim = MustSimulate(Options(ScheduleKind::k1F1B, 4, 8));
  // Stage 3 (last) waits for its first activation, then at the step end; stage 0 never warms up.
  EXPECT_DOUBLE_EQ(sim.stages[3].bubble_by_kind[static_cast<int>(BubbleKind::kWarmup)], 3);
  EXPECT_DOUBLE_EQ(sim.stages[3].bubble_by_kind[static_cast<int>(BubbleKind::kCooldown)], 6);
  EXPECT_DOUBLE_EQ(sim.stages[0].bubble_by_kind[static_cast<int>(BubbleKind::kWarmup)], 0);
  EXPECT_DOUBLE_EQ(sim.stages[0].bubble_by_kind[static_cast<int>(BubbleKind::kFill)], 6);
  CostModel slow_reduce = CostModel::Uniform();
  slow_reduce.reduce = 2;
  SimResult sync = MustSimulate(Options(ScheduleKind::k1F1B, 4, 8, 1, slow_reduce));
  // The tied-embedding all-reduce of stages 0 and 3 leaves them a sync bubble.
  EXPECT_DOUBLE_EQ(sync.stages[0].bubble_by_kind[static_cast<int>(BubbleKind::kSync)], 2);
  EXPECT_DOUBLE_EQ(sync.stages[1].bubble_by_kind[static_cast<int>(BubbleKind::kSync)], 0);
  // Its own cost, when given, replaces `reduce` for that sum (dp = 1: no other sum here).
  absl::StatusOr<CostModel> tied = ParseCostSpec("f=1,b=1,w=1,reduce=2,tied=5");
  ASSERT_TRUE(tied.ok()) << tied.status();
  EXPECT_NE(FormatCostModel(*tied).find("tied=5"), std::string::npos) << FormatCostModel(*tied);
  SimResult slow_tied = MustSimulate(Options(ScheduleKind::k1F1B, 4, 8, 1, *tied));
  EXPECT_DOUBLE_EQ(slow_tied.stages[3].bubble_by_kind[static_cast<int>(BubbleKind::kSync)], 5);
  EXPECT_FALSE(ParseCostSpec("tied=-1").ok());
}

TEST(GeneratorsTest, UnevenStagesAndCommunicationCost) {
  CostModel cost;
  cost.stages = {{1, 1, 1}, {2, 2, 2}, {1, 1, 1}};
  cost.comm = 0.25;
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kZBH1}) {
    absl::StatusOr<Schedule> s = BuildSchedule(Options(kind, 3, 6, 1, cost));
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_TRUE(Validate(*s).ok());
    SimResult sim = *Simulate(*s, cost);
    // The slow middle stage bounds the step from below: all its work plus the pipeline fill.
    EXPECT_GE(sim.step_time, 6 * 6 + 1 + 0.25);
    EXPECT_NEAR(sim.stages[1].busy, 36, 1e-9);
  }
}

TEST(GeneratorsTest, RefusalsSayWhy) {
  EXPECT_THAT(BuildSchedule(Options(ScheduleKind::kInterleaved, 4, 6, 2)).status().message(),
              HasSubstr("micro-batches must be a multiple of stages"));
  EXPECT_THAT(BuildSchedule(Options(ScheduleKind::kInterleaved, 4, 8, 1)).status().message(),
              HasSubstr("needs at least 2 model chunks"));
  EXPECT_THAT(BuildSchedule(Options(ScheduleKind::k1F1B, 4, 8, 2)).status().message(),
              HasSubstr("runs one model chunk per stage"));
  EXPECT_THAT(BuildSchedule(Options(ScheduleKind::kGPipe, 0, 8)).status().message(),
              HasSubstr("must be at least 1"));
  CostModel wrong;
  wrong.stages = {{1, 1, 1}, {1, 1, 1}};
  EXPECT_THAT(BuildSchedule(Options(ScheduleKind::k1F1B, 4, 8, 1, wrong)).status().message(),
              HasSubstr("expected 1 or 4"));
}

TEST(GeneratorsTest, BubblesReportFreeMemoryWhenTheCostModelKnowsIt) {
  CostModel cost = CostModel::Uniform();
  cost.memory_total = 1000;
  cost.memory_static = 100;
  cost.memory_per_buffer = 50;
  absl::StatusOr<Schedule> s = BuildSchedule(Options(ScheduleKind::k1F1B, 4, 8, 1, cost));
  ASSERT_TRUE(s.ok());
  for (const Instr& in : s->per_stage[0]) {
    if (in.op == Op::kBubble && in.bubble == BubbleKind::kFill) {
      EXPECT_EQ(in.free_bytes, 1000 - 100 - 4 * 50);  // four forwards stashed on stage 0
    }
  }
}

}  // namespace
}  // namespace freeride::pipeline
