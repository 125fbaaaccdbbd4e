#include "trainer/run_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/files.h"
#include "core/status.h"

namespace freeride {

absl::Status CheckWritableDirectory(const std::string& dir, const std::string& key) {
  absl::Status made = MakeDirectories(dir);
  if (made.ok()) {
    const std::string probe = absl::StrCat(dir, "/.write_test.", getpid());
    const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      close(fd);
      unlink(probe.c_str());
      return absl::OkStatus();
    }
    made = absl::PermissionDeniedError(std::strerror(errno));
  }
  return absl::PermissionDeniedError(absl::StrFormat(
      "%s = \"%s\" cannot be written (%s): the run would fail at its first write there; "
      "choose a writable directory",
      key, dir, made.message()));
}

absl::StatusOr<DirectoryLock> PrepareRunDir(const Config& config) {
  FR_RETURN_IF_ERROR(CheckWritableDirectory(config.run.dir, "run.dir"));
  absl::StatusOr<DirectoryLock> lock = DirectoryLock::Acquire(config.run.dir);
  if (!lock.ok()) return lock.status();
  FR_RETURN_IF_ERROR(
      WriteFileAtomically(absl::StrCat(config.run.dir, "/config.toml"),
                          absl::StrCat("# Effective config of this run, every key spelled "
                                       "out; `freeride config check` reads it back.\n",
                                       ConfigToToml(config))));
  return lock;
}

}  // namespace freeride
