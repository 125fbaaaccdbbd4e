// An advisory lock on a directory, so that two runs never share one run.dir: their metrics
// would interleave and config.toml would stop describing the checkpoints beside it. The lock
// is flock(2) on `<dir>/.lock`, which also names the holder (host and pid) for the message a
// second run gets; the kernel drops it when the holder exits, however it exits, so a crashed
// run never leaves a stale lock behind.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace freeride {

class DirectoryLock {
 public:
  // Takes the lock on `dir` (which must exist) or says who holds it.
  static absl::StatusOr<DirectoryLock> Acquire(const std::string& dir);

  DirectoryLock(DirectoryLock&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) {
    other.fd_ = -1;
  }
  DirectoryLock& operator=(DirectoryLock&& other) noexcept;
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  ~DirectoryLock();

  const std::string& path() const { return path_; }

 private:
  DirectoryLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

}  // namespace freeride
