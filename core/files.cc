#include "core/files.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace freeride {
namespace {

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrCat(path, ": ", what, ": ", std::strerror(errno)));
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  const std::string temporary = absl::StrCat(path, ".tmp.", getpid());
  int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot create", temporary);
  size_t written = 0;
  while (written < contents.size()) {
    ssize_t n = write(fd, contents.data() + written, contents.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      absl::Status status = ErrnoError("cannot write", temporary);
      close(fd);
      unlink(temporary.c_str());
      return status;
    }
    written += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0 || close(fd) != 0) {
    absl::Status status = ErrnoError("cannot flush", temporary);
    unlink(temporary.c_str());
    return status;
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    absl::Status status = ErrnoError("cannot rename into place", path);
    unlink(temporary.c_str());
    return status;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

absl::Status CheckRegularFile(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return absl::OkStatus();
  const char* what = S_ISDIR(st.st_mode)    ? "a directory"
                     : S_ISFIFO(st.st_mode) ? "a FIFO (named pipe)"
                     : S_ISCHR(st.st_mode)  ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : "a special file";
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": is ", what, ", not a regular file"));
}

absl::Status MakeDirectories(const std::string& path) {
  std::error_code error;
  std::filesystem::create_directories(path, error);
  if (error || !std::filesystem::is_directory(path)) {
    return absl::InternalError(absl::StrCat(path, ": cannot create directory: ",
                                            error ? error.message() : "exists as a file"));
  }
  return absl::OkStatus();
}

bool GlobMatchesAFile(const std::string& pattern) {
  glob_t matches{};
  const bool found = ::glob(pattern.c_str(), 0, nullptr, &matches) == 0 && matches.gl_pathc > 0;
  globfree(&matches);
  return found;
}

}  // namespace freeride
