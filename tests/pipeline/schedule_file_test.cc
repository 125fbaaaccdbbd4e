// Schedule files: torch.distributed.pipelining's CSV read and written (a schedule designed in
// either tool runs in the other), and any form loaded, completed and validated with errors
// that name the file and line.
#include "pipeline/schedule_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_format.h"
#include "pipeline/generators.h"
#include "pipeline/passes.h"
#include "tests/pipeline/schedule_builders.h"

namespace freeride::pipeline {
namespace {

std::vector<std::vector<Instr>> ComputeOrder(const Schedule& s) {
  std::vector<std::vector<Instr>> out(s.stages);
  for (int st = 0; st < s.stages; ++st) {
    for (const Instr& in : s.per_stage[st]) {
      if (IsCompute(in.op)) out[st].push_back({in.op, in.stage, in.chunk, in.microbatch});
    }
  }
  return out;
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = (std::filesystem::path(::testing::TempDir()) / name).string();
  std::ofstream(path) << text;
  return path;
}

TEST(TorchCsvTest, EveryKindRoundTrips) {
  for (ScheduleKind kind :
       {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved, ScheduleKind::kZBH1,
        ScheduleKind::kZBH2, ScheduleKind::kZBV, ScheduleKind::kDualPipeV}) {
    SCOPED_TRACE(ScheduleKindName(kind));
    const Schedule s = MustBuild(kind, 4, 8, kind == ScheduleKind::kInterleaved ? 2 : 1);
    const std::string csv = ScheduleToTorchCsv(s);
    absl::StatusOr<Schedule> back = ScheduleFromTorchCsv(csv);
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_EQ(back->stages, s.stages);
    EXPECT_EQ(back->microbatches, s.microbatches);
    EXPECT_EQ(back->chunks, s.chunks);
    EXPECT_EQ(back->placement, s.placement);
    EXPECT_EQ(ComputeOrder(*back), ComputeOrder(s));
    EXPECT_EQ(ScheduleToTorchCsv(*back), csv);
  }
}

TEST(TorchCsvTest, ReadsCommunicationOverlapAndIdleCells) {
  // A 2-rank V (torch's style: stage 0 and 3 on rank 0), written with comm actions, an idle
  // cell and DualPipe's overlapped pair.
  const std::string csv =
      "0F0,,0SEND_F0,3RECV_F0,3F0,3I0,3W0,0RECV_B0,0I0,0W0\n"
      "1RECV_F0,1F0,1SEND_F0,2F0,2SEND_F0,2RECV_B0,(2I0;1RECV_B0)OVERLAP_F_B,1I0,2W0,1W0\n";
  absl::StatusOr<Schedule> s = ScheduleFromTorchCsv(csv);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->placement, Placement::kV);
  EXPECT_EQ(s->chunks, 2);
  EXPECT_EQ(s->microbatches, 1);
  ASSERT_EQ(s->per_stage[1].size(), 6u);
  EXPECT_EQ(FormatInstr(s->per_stage[1][2], 2), "I0c1");  // global stage 2 = rank 1 chunk 1
}

TEST(TorchCsvTest, RefusesWhatItCannotRun) {
  EXPECT_NE(ScheduleFromTorchCsv("0UNSHARD,0F0\n").status().message().find("FSDP"),
            std::string::npos);
  EXPECT_NE(ScheduleFromTorchCsv("0F0,0Q0\n").status().message().find("unknown action"),
            std::string::npos);
  // Stage 1 on rank 0 and stage 0 on rank 1: neither a loop nor a V.
  EXPECT_NE(ScheduleFromTorchCsv("1F0\n0F0\n").status().message().find("neither a loop"),
            std::string::npos);
}

TEST(ScheduleFileTest, TextCsvAndTorchFormsLoadAsTheGeneratedSchedule) {
  for (ScheduleKind kind :
       {ScheduleKind::k1F1B, ScheduleKind::kZBH2, ScheduleKind::kZBV, ScheduleKind::kDualPipeV}) {
    SCOPED_TRACE(ScheduleKindName(kind));
    const Schedule s = MustBuild(kind, 3, 6);
    for (const auto& [name, text] :
         {std::pair{"s.txt", ScheduleToText(s)}, std::pair{"s.csv", ScheduleToCsv(s)},
          std::pair{"torch.csv", ScheduleToTorchCsv(s)}}) {
      SCOPED_TRACE(name);
      absl::StatusOr<Schedule> loaded =
          LoadScheduleFile(WriteTemp(name, text), CostModel::Uniform(), false);
      ASSERT_TRUE(loaded.ok()) << loaded.status().message();
      EXPECT_EQ(loaded->per_stage, s.per_stage);
      EXPECT_EQ(loaded->buffers_per_stage, s.buffers_per_stage);
    }
  }
}

TEST(ScheduleFileTest, ErrorsNameTheFileAndLine) {
  // Stage 1's backward before its forward: reported on stage 1's line (line 3).
  const std::string path =
      WriteTemp("bad.txt", "# hand-written\nstage0: F0 F1 B0 B1\nstage1: F0 B1 F1 B0\n");
  absl::StatusOr<Schedule> s = LoadScheduleFile(path, CostModel::Uniform(), false);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find(path + ":3: invalid schedule: stage 1"), std::string::npos)
      << s.status().message();
  // A data-parallel run needs REDUCE_GRADS in a file that places its own communication.
  const std::string with_comm =
      WriteTemp("comm.txt", ScheduleToText(MustBuild(ScheduleKind::k1F1B, 2, 2)));
  s = LoadScheduleFile(with_comm, CostModel::Uniform(), true);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("REDUCE_GRADS"), std::string::npos);
  EXPECT_FALSE(LoadScheduleFile("/nonexistent/s.txt", CostModel::Uniform(), false).ok());
}

}  // namespace
}  // namespace freeride::pipeline
