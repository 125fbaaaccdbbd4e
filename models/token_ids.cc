#include "models/token_ids.h"

#include "absl/strings/str_format.h"

namespace freeride {

absl::Status CheckTokenIds(const int32_t* ids, int64_t n, int64_t vocab_size, const char* what) {
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s[%d] = %d: outside the model's vocabulary [0, %d)", what, i, ids[i], vocab_size));
    }
  }
  return absl::OkStatus();
}

}  // namespace freeride
