#include "trainer/cli/cmd_report.h"

#include <iostream>

#include "absl/strings/str_cat.h"
#include "core/files.h"
#include "trainer/cli/cli.h"
#include "trainer/report/report.h"

namespace freeride {

std::vector<FlagSpec> ReportFlags() {
  return {{"out", "FILE.html", "where the page goes (default RUN_DIR/report.html)"}};
}

int ReportCommand(const ParsedFlags& flags) {
  if (flags.positional().size() != 1) {
    std::cerr << "error: report takes one RUN_DIR (the run.dir of a train or study run)\n";
    return kExitUsage;
  }
  const std::string dir = flags.positional()[0];
  absl::StatusOr<RunFiles> run = LoadRunFiles(dir);
  if (!run.ok()) {
    std::cerr << "error: " << run.status().message() << "\n";
    return kExitFailure;
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
