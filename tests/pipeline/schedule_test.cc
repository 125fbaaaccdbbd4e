// The IR's text and CSV forms: round trips, golden files, and parse errors.
#include "pipeline/schedule.h"

#include <map>

#include "core/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipeline/generators.h"
#include "pipeline/passes.h"
#include "tests/pipeline/schedule_builders.h"

namespace freeride::pipeline {
namespace {

using testing::HasSubstr;

TEST(ScheduleTest, TokensPrintAndParse) {
  for (const char* token : {"F3", "B0", "I12", "W7", "SEND_F3", "RECV_B2", "LOAD5",
                            "REDUCE_TIED", "REDUCE_GRADS", "OPTIMIZER", "BUBBLE(warmup,4.2ms)",
                            "BUBBLE(sync,0.125ms)"}) {
    absl::StatusOr<Instr> instr = ParseInstr(token, 0);
    ASSERT_TRUE(instr.ok()) << token << ": " << instr.status();
    EXPECT_EQ(FormatInstr(*instr, 1), token);
  }
  absl::StatusOr<Instr> chunked = ParseInstr("SEND_F3c1", 2);
  ASSERT_TRUE(chunked.ok());
  EXPECT_EQ(chunked->op, Op::kSendAct);
  EXPECT_EQ(chunked->chunk, 1);
  EXPECT_EQ(chunked->microbatch, 3);
  EXPECT_EQ(chunked->stage, 2);
  EXPECT_EQ(FormatInstr(*chunked, 2), "SEND_F3c1");
  EXPECT_EQ(ParseInstr("BUBBLE(fill,2s)", 0)->duration_ms, 2000);
}

TEST(ScheduleTest, BadTokensAreRejectedWithTheReason) {
  EXPECT_THAT(ParseInstr("X3", 0).status().message(), HasSubstr("unknown operation"));
  EXPECT_THAT(ParseInstr("F", 0).status().message(), HasSubstr("expected a micro-batch"));
  EXPECT_THAT(ParseInstr("OPTIMIZER2", 0).status().message(), HasSubstr("takes no micro-batch"));
  EXPECT_THAT(ParseInstr("BUBBLE(lunch,1ms)", 0).status().message(),
              HasSubstr("unknown bubble kind 'lunch'"));
  EXPECT_THAT(ParseInstr("BUBBLE(fill)", 0).status().message(),
              HasSubstr("expected BUBBLE(kind,duration)"));
  EXPECT_THAT(ScheduleFromText("stage1: F0\n").status().message(),
              HasSubstr("line 1: expected 'stage0:'"));
  EXPECT_THAT(ScheduleFromText("stage0: F0 Q1\n").status().message(),
              HasSubstr("line 1: bad token 'Q1'"));
}

TEST(ScheduleTest, TextRoundTripsForEveryKind) {
  for (const Schedule& s : {MustBuild(ScheduleKind::kGPipe, 3, 5), MustBuild(ScheduleKind::k1F1B, 4, 6),
                            MustBuild(ScheduleKind::kInterleaved, 2, 4, 3),
                            MustBuild(ScheduleKind::kZBH1, 4, 8)}) {
    const std::string text = ScheduleToText(s);
    absl::StatusOr<Schedule> parsed = ScheduleFromText(text);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(ScheduleToText(*parsed), text);
    EXPECT_EQ(parsed->kind, s.kind);
    EXPECT_EQ(parsed->chunks, s.chunks);
  }
}

TEST(ScheduleTest, TextWithoutHeaderInfersTheShape) {
  absl::StatusOr<Schedule> s =
      ScheduleFromText("stage0: F0 SEND_F0 F1c1\nstage1: RECV_F0 F2\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->stages, 2);
  EXPECT_EQ(s->microbatches, 3);
  EXPECT_EQ(s->chunks, 2);
  EXPECT_EQ(s->kind, ScheduleKind::kCustom);
}

TEST(ScheduleTest, CsvRoundTripKeepsEveryField) {
  Schedule s = MustBuild(ScheduleKind::kInterleaved, 2, 4, 2);
  absl::StatusOr<Schedule> parsed = ScheduleFromCsv(ScheduleToCsv(s));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->per_stage, s.per_stage);
  EXPECT_EQ(parsed->kind, s.kind);
  EXPECT_THAT(ScheduleFromCsv("stage,index,op\n0,0,FORWARD\n").status().message(),
              HasSubstr("csv line 2: expected 10 fields"));
  EXPECT_THAT(ScheduleFromCsv("stage,index,op,chunk,microbatch,buffer,peer,bubble,duration_ms,"
                              "free_bytes\n0,0,FLY,0,0,0,-1,,0,-1\n")
                  .status()
                  .message(),
              HasSubstr("unknown op 'FLY'"));
}

// Golden schedules: a change to a generator or pass shows up here first. Regenerate with
// `build/freeride schedule --kind K --stages P --microbatches M [--chunks V]`.
TEST(ScheduleTest, GoldenFiles) {
  struct Golden {
    const char* file;
    ScheduleKind kind;
    int p, m, v;
  };
  for (const Golden& g : {Golden{"gpipe_p2_m3", ScheduleKind::kGPipe, 2, 3, 1},
                          Golden{"1f1b_p4_m8", ScheduleKind::k1F1B, 4, 8, 1},
                          Golden{"1f1b_p4_m2", ScheduleKind::k1F1B, 4, 2, 1},
                          Golden{"interleaved_p2_m4_v2", ScheduleKind::kInterleaved, 2, 4, 2},
                          Golden{"zbh1_p4_m8", ScheduleKind::kZBH1, 4, 8, 1}}) {
    absl::StatusOr<std::string> golden =
        ReadFile(std::string("tests/data/schedules/") + g.file + ".txt");
    ASSERT_TRUE(golden.ok()) << golden.status();
    EXPECT_EQ(ScheduleToText(MustBuild(g.kind, g.p, g.m, g.v)), *golden) << g.file;
  }
}

// A bubble's key names it in every placement: the bubbles 1F1B's uniform costs place and those
// a skewed stage (the last twice as slow) places sit at other indices, yet each kept bubble has
// the same key, a key appears once in a stage, and the non-BUBBLE instructions keep their order.
TEST(ScheduleTest, ABubblesKeySurvivesItsPlacementWithOtherCosts) {
  ScheduleOptions options;
  options.kind = ScheduleKind::k1F1B;
  options.stages = 3;
  options.microbatches = 4;
  absl::StatusOr<Schedule> uniform = BuildSchedule(options);
  ASSERT_TRUE(uniform.ok()) << uniform.status();
  Schedule skewed = *uniform;
  CostModel cost;
  cost.stages = {StageCost{1, 1, 0}, StageCost{1, 1, 0}, StageCost{2, 2, 0}};
  ASSERT_TRUE(InsertBubbles(&skewed, cost).ok());
  int moved = 0, kept = 0;
  for (int s = 0; s < 3; ++s) {
    const std::vector<Instr>& a = uniform->per_stage[s];
    const std::vector<Instr>& b = skewed.per_stage[s];
    std::vector<Instr> a_work, b_work;
    std::map<BubbleKey, int> a_keys;
    const std::vector<BubbleKey> ka = BubbleKeys(a), kb = BubbleKeys(b);
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].op != Op::kBubble) {
        EXPECT_EQ(ka[i].anchor, -1);
        a_work.push_back(a[i]);
        continue;
      }
      // The anchor counts the instructions before it that are not BUBBLEs.
      EXPECT_EQ(ka[i].anchor, static_cast<int>(a_work.size()));
      EXPECT_EQ(ka[i].kind, a[i].bubble);
      EXPECT_TRUE(a_keys.emplace(ka[i], static_cast<int>(i)).second) << "stage " << s;
    }
    for (size_t i = 0; i < b.size(); ++i) {
      if (b[i].op != Op::kBubble) {
        b_work.push_back(b[i]);
        continue;
      }
      const auto it = a_keys.find(kb[i]);
      if (it == a_keys.end()) continue;
      ++kept;
      moved += it->second != static_cast<int>(i);
      // The same instruction follows it in both placements.
      size_t na = it->second, nb = i;
      while (a[na].op == Op::kBubble) ++na;
      while (b[nb].op == Op::kBubble) ++nb;
      EXPECT_EQ(a[na], b[nb]) << "stage " << s;
    }
    EXPECT_EQ(a_work, b_work) << "stage " << s;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(moved, 0);  // the case the key is for: a kept bubble at another index
}

}  // namespace
}  // namespace freeride::pipeline
