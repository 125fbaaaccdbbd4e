// A run directory's fill jobs as `freeride jobs` and the training's leader read them: the input
// is split at its first NUL into job.json and jobs.jsonl (also the job's progress.jsonl).
#include <algorithm>
#include <filesystem>

#include "tests/fuzz/fuzz_files.h"
#include "trainer/jobs/job_store.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string run = freeride::fuzz::ScratchDir() + "/run";
  static const bool made = std::filesystem::create_directories(run + "/jobs/1");
  (void)made;
  const uint8_t* split = std::find(data, data + size, uint8_t{0});
  const size_t first = static_cast<size_t>(split - data);
  const size_t rest = first < size ? size - first - 1 : 0;
  freeride::fuzz::WriteInput("job.json", data, first, run + "/jobs/1");
  freeride::fuzz::WriteInput("jobs.jsonl", split + (first < size), rest, run);
  freeride::fuzz::WriteInput("progress.jsonl", split + (first < size), rest, run + "/jobs/1");
  absl::StatusOr<std::vector<freeride::Job>> jobs = freeride::LoadJobs(run);
  if (jobs.ok()) {
    for (const freeride::Job& job : *jobs) freeride::JobToJson(job).dump();
  }
  return 0;
}
