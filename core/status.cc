#include "core/status.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace freeride {
namespace {

constexpr absl::string_view kUsagePayload = "freeride/usage";

}  // namespace

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

absl::Status UsageError(absl::Status status) {
  if (!status.ok()) status.SetPayload(kUsagePayload, absl::Cord("1"));
  return status;
}

bool IsUsageError(const absl::Status& status) {
  return status.GetPayload(kUsagePayload).has_value();
}

}  // namespace freeride
