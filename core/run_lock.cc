#include "core/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "core/files.h"

namespace freeride {

absl::StatusOr<DirectoryLock> DirectoryLock::Acquire(const std::string& dir) {
  const std::string path = dir + "/.lock";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrFormat("cannot create the run lock %s: %s", path, std::strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    close(fd);
    if (err != EWOULDBLOCK) {
      return absl::InternalError(
          absl::StrFormat("cannot lock %s: %s", path, std::strerror(err)));
    }
    absl::StatusOr<std::string> holder = ReadFile(path);
    const std::string who = holder.ok() && !holder->empty()
                                ? std::string(absl::StripAsciiWhitespace(*holder))
                                : "another process";
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is in use by another run (%s holds %s): give this run its own run.dir, or wait "
        "for that one to end",
        dir, who, path));
  }
  char host[256] = "unknown-host";
  gethostname(host, sizeof(host) - 1);
  const std::string holder = absl::StrFormat("host %s pid %d\n", host, getpid());
  // Only the lock holder writes, so truncating here cannot erase another holder's name.
  if (ftruncate(fd, 0) != 0 || pwrite(fd, holder.data(), holder.size(), 0) < 0) {
    const int err = errno;
    close(fd);
    return absl::PermissionDeniedError(
        absl::StrFormat("cannot write the run lock %s: %s", path, std::strerror(err)));
  }
  return DirectoryLock(fd, path);
}

DirectoryLock& DirectoryLock::operator=(DirectoryLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) close(fd_);  // closing the last descriptor releases the flock
}

}  // namespace freeride
