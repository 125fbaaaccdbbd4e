#include "core/status.h"

#include "absl/strings/str_cat.h"

namespace freeride {

absl::Status LibraryError(absl::StatusCode status_code, absl::string_view library, long code,
                          absl::string_view code_text, absl::string_view expr,
                          absl::string_view file, int line) {
  return absl::Status(status_code, absl::StrCat(library, " error ", code, " (", code_text,
                                                ") in `", expr, "` at ", file, ":", line));
}

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(status.message(), "\n  while ", context));
}

}  // namespace freeride
