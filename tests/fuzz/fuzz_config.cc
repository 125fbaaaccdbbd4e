// Config TOML and job files: any text is a config (or a job's [[side_tasks]] table) or an
// error naming where it is wrong; neither throws nor crashes.
#include <string>

#include "trainer/config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<freeride::Config> config = freeride::ParseConfig(text, "fuzz.toml", {});
  static const freeride::Config run = [] {
    absl::StatusOr<freeride::Config> c =
        freeride::ParseConfig("[data]\ntrain = \"x.bin\"\n[parallel]\npp = 2\n", "run.toml", {});
    return c.ok() ? *c : freeride::Config();
  }();
  freeride::ParseSideTaskFile(text, "job.toml", run).status().IgnoreError();
  if (config.ok()) freeride::ConfigToToml(*config);
  return 0;
}
