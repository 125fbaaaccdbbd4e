// File helpers with the guarantees the project relies on: a file written with
// WriteFileAtomically is either the old version or the complete new one, never a torn mix,
// because it is written to a temporary name in the same directory, flushed, and renamed.
#pragma once

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace freeride {

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);
absl::StatusOr<std::string> ReadFile(const std::string& path);
// OK when `path` is a regular file (or a link to one) or does not exist (its open then says
// so); else an error naming what it is. Data files are checked before they are opened: opening
// a FIFO blocks until a writer comes, reading a device may never end, and a directory would be
// reported as a short file.
absl::Status CheckRegularFile(const std::string& path);
// Creates `path` and its parents; OK when it already exists as a directory.
absl::Status MakeDirectories(const std::string& path);
// Whether the shell-style glob `pattern` (or a plain path) names at least one existing file.
bool GlobMatchesAFile(const std::string& pattern);

}  // namespace freeride
