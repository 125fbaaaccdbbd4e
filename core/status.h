// Status plumbing shared by every module: early-return macros for absl::Status and
// absl::StatusOr, and the one formatter that turns a third-party library's error code into a
// Status naming the library, its own error text, the failing expression and file:line.
#pragma once

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace freeride {

// Builds the Status for a failed library call. `code_text` is the library's own name and
// description of `code` (e.g. "cudaErrorMemoryAllocation: out of memory").
absl::Status LibraryError(absl::StatusCode status_code, absl::string_view library, long code,
                          absl::string_view code_text, absl::string_view expr,
                          absl::string_view file, int line);

// Adds "while <context>" to a non-OK status, keeping its code.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

// Marks an error as bad usage (the command line must change: exit status 2) rather than a
// failure of the work, so that a refusal found deep inside (a resume that would reshape the
// learning-rate schedule) still reaches the user as status 2. The mark is a payload: the code
// and message are kept.
absl::Status UsageError(absl::Status status);
bool IsUsageError(const absl::Status& status);

}  // namespace freeride

#define FR_STATUS_CONCAT_INNER(a, b) a##b
#define FR_STATUS_CONCAT(a, b) FR_STATUS_CONCAT_INNER(a, b)

// Returns the status from the enclosing function when `expr` is not OK.
#define FR_RETURN_IF_ERROR(expr)                       \
  do {                                                 \
    ::absl::Status fr_status_ = (expr);                \
    if (!fr_status_.ok()) return fr_status_;           \
  } while (0)

// `FR_ASSIGN_OR_RETURN(auto x, F())` declares x from an OK StatusOr, or returns its status.
#define FR_ASSIGN_OR_RETURN(lhs, expr) \
  FR_ASSIGN_OR_RETURN_IMPL(FR_STATUS_CONCAT(fr_statusor_, __LINE__), lhs, expr)
#define FR_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
