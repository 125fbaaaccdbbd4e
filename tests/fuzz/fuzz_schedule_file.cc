// Schedule files in their three forms (freeride text, freeride CSV, torch CSV): loaded,
// completed and validated, or refused with the line at fault.
#include "pipeline/cost_model.h"
#include "pipeline/schedule_file.h"
#include "tests/fuzz/fuzz_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = freeride::fuzz::WriteInput("schedule.txt", data, size);
  const freeride::pipeline::CostModel cost;
  for (bool dp : {false, true}) {
    freeride::pipeline::LoadScheduleFile(path, cost, dp).status().IgnoreError();
  }
  return 0;
}
