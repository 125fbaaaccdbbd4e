// Post-validated steps in the simulator: no all-stage barrier at OPTIMIZER, each stage steps
// once its own gradients are summed and goes on with the next step, and the step time is the
// steady period of consecutive steps. On uniform costs that period is the bubble-free time
// m(F+B+W) plus the papers' closed-form bubble, so ZB-H2 and ZB-V reach zero bubble; the
// data-parallel all-reduce in buckets overlaps the last backward.
#include <gtest/gtest.h>

#include "absl/strings/str_format.h"
#include "pipeline/passes.h"
#include "pipeline/render.h"
#include "pipeline/validator.h"
#include "tests/pipeline/schedule_builders.h"

namespace freeride::pipeline {
namespace {

Schedule BuildSynced(ScheduleKind kind, int p, int m, int v, StepSync sync,
                     const CostModel& cost = CostModel::Uniform(), bool dp = false) {
  ScheduleOptions o = Options(kind, p, m, v, cost);
  o.step_sync = sync;
  o.data_parallel = dp;
  absl::StatusOr<Schedule> s = BuildSchedule(o);
  EXPECT_TRUE(s.ok()) << s.status();
  if (s.ok()) {
    EXPECT_TRUE(Validate(*s).ok()) << Validate(*s).message();
  }
  return s.ok() ? *s : Schedule{};
}

double StepTime(ScheduleKind kind, int p, int m, int v, StepSync sync,
                const CostModel& cost = CostModel::Uniform()) {
  return MustSimulate(BuildSynced(kind, p, m, v, sync, cost), cost).step_time;
}

// The check: `freeride simulate --kind zbh2 --stages 4 --microbatches 8` post-validated
// is within 2% of the schedule's own bubble-free time, 8 × (F + B + W); with the barrier it
// pays (p-1)·F more.
TEST(PostValidationSimTest, ZBH2ReachesTheBubbleFreeStepTime) {
  const double free = 8 * 3.0;
  const double post = StepTime(ScheduleKind::kZBH2, 4, 8, 1, StepSync::kPostValidate);
  EXPECT_LE(std::abs(post - free), 0.02 * free) << post;
  EXPECT_DOUBLE_EQ(post, free);
  EXPECT_DOUBLE_EQ(StepTime(ScheduleKind::kZBH2, 4, 8, 1, StepSync::kBarrier), free + 3.0);
}

// Every kind: the steady period is m(F+B+W) plus the schedule's own bubble, the papers'
// closed forms; never longer than the barrier's step.
TEST(PostValidationSimTest, PeriodIsBubbleFreeTimePlusTheClosedForm) {
  for (int p : {2, 3, 4, 6}) {
    for (int m : {2 * p, 2 * p + 3, 4 * p}) {
      SCOPED_TRACE(absl::StrFormat("p=%d m=%d", p, m));
      const double free = 3.0 * m;
      struct Case {
        ScheduleKind kind;
        int v;
        double bubble;
      };
      std::vector<Case> cases = {{ScheduleKind::kGPipe, 1, 3.0 * (p - 1)},
                                 {ScheduleKind::k1F1B, 1, 3.0 * (p - 1)},
                                 {ScheduleKind::kZBH1, 1, 1.0 * (p - 1)},
                                 {ScheduleKind::kZBH2, 1, 0.0},
                                 {ScheduleKind::kZBV, 2, 0.0},
                                 {ScheduleKind::kDualPipeV, 2, 0.5 * (p - 1)}};
      if (m % p == 0) cases.push_back({ScheduleKind::kInterleaved, 2, 1.5 * (p - 1)});
      for (const Case& c : cases) {
        SCOPED_TRACE(ScheduleKindName(c.kind));
        const Schedule s = BuildSynced(c.kind, p, m, c.v, StepSync::kPostValidate);
        const SimResult r = MustSimulate(s, CostModel::Uniform());
        EXPECT_NEAR(r.step_time, free + c.bubble, 1e-9);
        EXPECT_NEAR(r.schedule_bubble, c.bubble, 1e-9);
        EXPECT_LE(r.step_time, StepTime(c.kind, p, m, c.v, StepSync::kBarrier) + 1e-9);
        // One steady step per stage: its bubbles are its window less its compute.
        for (const StageResult& stage : r.stages) {
          EXPECT_NEAR(stage.bubble + stage.busy, r.step_time, 1e-9) << "stage " << stage.stage;
        }
      }
    }
  }
}

// Communication and uneven stages: still no longer than the barrier's, and the validation
// point's wait (a cooldown bubble) is where a stage would otherwise wait for the others.
TEST(PostValidationSimTest, NeverSlowerThanTheBarrierOnOtherCosts) {
  for (const CostModel& cost : {CostModel::Uniform(1, 2, 1, 0.1), CostModel::Uniform(2, 1, 1),
                                CostModel::Uniform(1, 1, 2, 0.3)}) {
    for (ScheduleKind kind : {ScheduleKind::k1F1B, ScheduleKind::kZBH1, ScheduleKind::kZBH2,
                              ScheduleKind::kZBV, ScheduleKind::kDualPipeV}) {
      const int v = PlacementOf(kind) == Placement::kV ? 2 : 1;
      SCOPED_TRACE(absl::StrFormat("%s %s", ScheduleKindName(kind), FormatCostModel(cost)));
      EXPECT_LE(StepTime(kind, 4, 8, v, StepSync::kPostValidate, cost),
                StepTime(kind, 4, 8, v, StepSync::kBarrier, cost) + 1e-9);
    }
  }
}

// The head makes its share of the tied gradient in I when post-validated, so its stage posts
// the tied sum after the head's last I (and the gradient it sends back), not at the step end.
TEST(PostValidationSimTest, HeadStagePostsTheTiedSumAfterItsLastInputGradient) {
  const Schedule s = BuildSynced(ScheduleKind::kZBH2, 4, 8, 1, StepSync::kPostValidate);
  const std::vector<Instr>& head = s.per_stage[3];
  size_t tied = 0, last_i = 0;
  for (size_t i = 0; i < head.size(); ++i) {
    if (head[i].op == Op::kReduceTied) tied = i;
    if (head[i].op == Op::kBackwardInput) last_i = i;
  }
  EXPECT_EQ(head[last_i + 1].op, Op::kSendGrad);
  EXPECT_EQ(tied, last_i + 2);
  // The embedding's stage still posts after its own last W.
  const std::vector<Instr>& embedding = s.per_stage[0];
  EXPECT_EQ(embedding[embedding.size() - 2].op, Op::kReduceTied);
  // The text form keeps the step sync.
  absl::StatusOr<Schedule> back = ScheduleFromText(ScheduleToText(s));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->step_sync, StepSync::kPostValidate);
  EXPECT_NE(
      SummaryJson(s, MustSimulate(s, CostModel::Uniform())).find("\"step_sync\":\"post_validate\""),
      std::string::npos);
}

TEST(PostValidationSimTest, ValidatorRefusesATiedSumBeforeItsShareIsMade) {
  Schedule s = BuildSynced(ScheduleKind::kZBH1, 2, 4, 1, StepSync::kPostValidate);
  std::vector<Instr>& head = s.per_stage[1];
  const auto tied = std::find_if(head.begin(), head.end(),
                                 [](const Instr& in) { return in.op == Op::kReduceTied; });
  ASSERT_NE(tied, head.end());
  const Instr moved = *tied;
  head.erase(tied);
  head.insert(head.begin(), moved);
  absl::Status status = Validate(s);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("rule 'tied'"), std::string::npos) << status.message();
  // A barrier step sums it at the end: there, after the head's last W.
  Schedule barrier = BuildSynced(ScheduleKind::kZBH1, 2, 4, 1, StepSync::kBarrier);
  EXPECT_EQ(barrier.per_stage[1][barrier.per_stage[1].size() - 2].op, Op::kReduceTied);
}

// With one stage the step is m(F+B+W) plus the exposed all-reduce: all of `reduce` after the
// last backward, or, in n buckets made during the last W, what the W does not cover:
// reduce - w(n-1)/n when every bucket takes longer than the W makes the next.
TEST(PostValidationSimTest, BucketedAllReduceOverlapsTheLastBackward) {
  for (StepSync sync : {StepSync::kBarrier, StepSync::kPostValidate}) {
    for (int n : {0, 1, 4}) {
      CostModel cost = CostModel::Uniform();
      cost.reduce = 4;
      cost.reduce_buckets = n;
      const Schedule s = BuildSynced(ScheduleKind::kZBH1, 1, 4, 1, sync, cost, /*dp=*/true);
      const SimResult r = MustSimulate(s, cost);
      SCOPED_TRACE(absl::StrFormat("%s buckets=%d", StepSyncName(sync), n));
      const double exposed = n == 0 ? 4.0 : 4.0 - (n - 1.0) / n;
      EXPECT_NEAR(r.step_time, 12 + exposed, 1e-9);
      EXPECT_NEAR(r.stages[0].bubble_by_kind[static_cast<int>(BubbleKind::kSync)], exposed, 1e-9);
    }
  }
}

TEST(PostValidationSimTest, CostSpecTakesABucketCount) {
  absl::StatusOr<CostModel> cost = ParseCostSpec("reduce=4,buckets=8");
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_EQ(cost->reduce_buckets, 8);
  EXPECT_NE(FormatCostModel(*cost).find("buckets=8"), std::string::npos);
  EXPECT_FALSE(ParseCostSpec("buckets=2.5").ok());
}

}  // namespace
}  // namespace freeride::pipeline
