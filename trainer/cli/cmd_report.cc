#include "trainer/cli/cmd_report.h"

#include <iostream>

#include "absl/strings/str_cat.h"
#include "core/files.h"
#include "trainer/cli/cli.h"
#include "trainer/report/report.h"
#include "trainer/report/report_compare.h"

namespace freeride {

std::vector<FlagSpec> ReportFlags() {
  return {{"out", "FILE.html",
           "where the page goes (default RUN_DIR/report.html; with several runs "
           "./compare.html)"}};
}

namespace {

// `freeride report RUN_A RUN_B ...`: one page comparing the runs.
int CompareCommand(const ParsedFlags& flags) {
  std::vector<RunFiles> runs;
  for (const std::string& dir : flags.positional()) {
    absl::StatusOr<RunFiles> run = LoadRunFiles(dir);
    if (!run.ok()) {
      std::cerr << "error: " << run.status().message() << "\n";
      return kExitUsage;
    }
    for (const std::string& note : run->notes) std::cerr << "note: " << dir << ": " << note << "\n";
    runs.push_back(*std::move(run));
  }
  const std::string out = flags.Get("out", "compare.html");
  if (absl::Status s = WriteFileAtomically(out, RenderComparison(runs)); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return kExitFailure;
  }
  std::cout << out << "\n";
  return kExitOk;
}

}  // namespace

int ReportCommand(const ParsedFlags& flags) {
  if (flags.positional().empty()) {
    std::cerr << "error: report takes a RUN_DIR (the run.dir of a train or study run), or "
                 "several to compare\n";
    return kExitUsage;
  }
  if (flags.positional().size() > 1) return CompareCommand(flags);
  const std::string dir = flags.positional()[0];
  absl::StatusOr<RunFiles> run = LoadRunFiles(dir);
  if (!run.ok()) {
    std::cerr << "error: " << run.status().message() << "\n";
    return kExitUsage;
  }
  if (!run->timelines.empty()) {
    const std::string trace = absl::StrCat(dir, "/trace.json");
    if (absl::Status s = WriteFileAtomically(trace, MergedTrace(*run)); !s.ok()) {
      std::cerr << "error: " << s.message() << "\n";
      return kExitFailure;
    }
  }
  const std::string out = flags.Get("out", absl::StrCat(dir, "/report.html"));
  if (absl::Status s = WriteFileAtomically(out, RenderReport(*run)); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return kExitFailure;
  }
  for (const std::string& note : run->notes) std::cerr << "note: " << note << "\n";
  std::cout << out << "\n";
  return kExitOk;
}

}  // namespace freeride
