// Facts about this build and the libraries it loaded, for `freeride version` and run logs.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace freeride {

// (name, value) rows: version, commit, compiler, build type, CUDA backend and library versions,
// MPI, BLAS, abseil, toml++.
std::vector<std::pair<std::string, std::string>> BuildInfo();

}  // namespace freeride
