#include "core/json_string.h"

#include "absl/strings/str_format.h"

namespace freeride {

std::string JsonString(absl::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out.push_back(c);
    }
  }
  return out + "\"";
}

}  // namespace freeride
