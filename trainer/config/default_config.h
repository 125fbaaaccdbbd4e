// The config the binary carries inside itself (configs/tiny_cpu.toml at build time), used when
// a command is given no config file.
#pragma once

#include "absl/strings/string_view.h"

namespace freeride {

inline constexpr absl::string_view kDefaultConfigName = "<embedded configs/tiny_cpu.toml>";
absl::string_view DefaultConfigToml();

}  // namespace freeride
