// Malformed schedules are rejected with the stage, position, rule and the grid around it.
#include "pipeline/validator.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipeline/passes.h"

namespace freeride::pipeline {
namespace {

using testing::HasSubstr;

// Parses the text form and derives peers and buffers, as `--input` does.
Schedule Parse(const std::string& text) {
  absl::StatusOr<Schedule> s = ScheduleFromText(text);
  EXPECT_TRUE(s.ok()) << s.status();
  ResolvePeers(&*s);
  AssignBuffers(&*s);
  return *s;
}

std::string ErrorOf(const std::string& text) {
  absl::Status status = Validate(Parse(text));
  EXPECT_FALSE(status.ok()) << text;
  return std::string(status.message());
}

constexpr char kGood[] =
    "stage0: LOAD0 F0 SEND_F0 LOAD1 F1 SEND_F1 RECV_B0 B0 RECV_B1 B1 REDUCE_TIED OPTIMIZER\n"
    "stage1: LOAD0 RECV_F0 F0 B0 SEND_B0 LOAD1 RECV_F1 F1 B1 SEND_B1 REDUCE_TIED OPTIMIZER\n";

TEST(ValidatorTest, AcceptsAHandWrittenSchedule) {
  EXPECT_TRUE(Validate(Parse(kGood)).ok()) << Validate(Parse(kGood));
}

TEST(ValidatorTest, MissingBackward) {
  std::string error = ErrorOf(
      "stage0: F0 SEND_F0 F1 SEND_F1 RECV_B0 B0 RECV_B1 B1\n"
      "stage1: RECV_F0 F0 B0 SEND_B0 RECV_F1 F1 SEND_B1\n");
  EXPECT_THAT(error, HasSubstr("stage 1"));
  EXPECT_THAT(error, HasSubstr("rule 'send after make'"));
  EXPECT_THAT(ErrorOf("stage0: F0 F1 B0\n"), HasSubstr("end of stage: rule 'once': B1 missing"));
}

TEST(ValidatorTest, BackwardBeforeForward) {
  std::string error = ErrorOf("stage0: F0 B1 F1 B0\n");
  EXPECT_THAT(error, HasSubstr("stage 0, position 1 (B1): rule 'order': backward before the "
                               "micro-batch's forward"));
  EXPECT_THAT(error, HasSubstr("stage0: F0 [B1] F1 B0"));  // the grid around it
  EXPECT_THAT(ErrorOf("stage0: F0 W0 I0\n"), HasSubstr("rule 'order': W before"));
}

TEST(ValidatorTest, DuplicatesAndMixedBackwards) {
  EXPECT_THAT(ErrorOf("stage0: F0 F0 B0\n"), HasSubstr("position 1 (F0): rule 'once'"));
  EXPECT_THAT(ErrorOf("stage0: F0 B0 I0 W0\n"), HasSubstr("rule 'once'"));
}

TEST(ValidatorTest, UnmatchedRecv) {
  std::string error = ErrorOf(
      "stage0: F0 F1 SEND_F1 RECV_B0 B0 RECV_B1 B1\n"
      "stage1: RECV_F0 F0 B0 SEND_B0 RECV_F1 F1 B1 SEND_B1\n");
  EXPECT_THAT(error, HasSubstr("rule 'channel order'"));
  std::string missing = ErrorOf(
      "stage0: F0 SEND_F0 RECV_B0 B0\n"
      "stage1: RECV_F0 F0 B0\n");
  EXPECT_THAT(missing, HasSubstr("stage 0, position 2 (RECV_B0): rule 'matched': no matching "
                                 "SEND on stage 1"));
}

TEST(ValidatorTest, RecvMustPrecedeUse) {
  EXPECT_THAT(ErrorOf("stage0: F0 SEND_F0 RECV_B0 B0\nstage1: F0 RECV_F0 B0 SEND_B0\n"),
              HasSubstr("stage 1, position 0 (F0): rule 'recv before use'"));
}

TEST(ValidatorTest, Deadlock) {
  // Stage 0 waits for a gradient before sending the activation that would produce it.
  std::string error = ErrorOf(
      "stage0: F0 RECV_B0 SEND_F0 B0\n"
      "stage1: RECV_F0 F0 B0 SEND_B0\n");
  EXPECT_THAT(error, HasSubstr("rule 'progress': deadlock"));
  EXPECT_THAT(error, HasSubstr("stage 0 waits at position 1 (RECV_B0)"));
  EXPECT_THAT(error, HasSubstr("stage 1 waits at position 0 (RECV_F0)"));
}

TEST(ValidatorTest, BufferConflicts) {
  Schedule s = Parse(kGood);
  for (Instr& in : s.per_stage[0]) {
    if (IsCompute(in.op)) in.buffer = 0;  // both micro-batches in slot 0 at once
  }
  EXPECT_THAT(Validate(s).message(), HasSubstr("rule 'buffers': buffer 0 still holds"));
  s = Parse(kGood);
  s.buffers_per_stage[1] = 0;
  EXPECT_THAT(Validate(s).message(), HasSubstr("outside the stage's 0 activation slots"));
}

TEST(ValidatorTest, WrongPeerIsCaught) {
  Schedule s = Parse(kGood);
  s.per_stage[0][2].peer = 0;  // SEND_F0 to itself
  EXPECT_THAT(Validate(s).message(), HasSubstr("neighbour is on stage 1"));
}

}  // namespace
}  // namespace freeride::pipeline
