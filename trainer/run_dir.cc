#include "trainer/run_dir.h"

#include "absl/strings/str_cat.h"
#include "core/files.h"
#include "core/status.h"

namespace freeride {

absl::Status PrepareRunDir(const Config& config) {
  FR_RETURN_IF_ERROR(MakeDirectories(config.run.dir));
  return WriteFileAtomically(absl::StrCat(config.run.dir, "/config.toml"),
                             absl::StrCat("# Effective config of this run, every key spelled "
                                          "out; `freeride config check` reads it back.\n",
                                          ConfigToToml(config)));
}

}  // namespace freeride
