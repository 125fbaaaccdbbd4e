// The instruction set the CPU kernels were compiled for (FREERIDE_ISA, CMakeLists.txt) and
// whether this CPU has it. A binary built on one node and started by mpirun on a node of another
// CPU generation would otherwise die of SIGILL in the middle of a kernel; the check says so
// before anything runs.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace freeride {

// "x86-64-v3" (the default), "x86-64-v2", "x86-64", "native" or "default".
const char* BuildIsa();

// The features `isa` needs that `cpu_has` (a feature name as __builtin_cpu_supports spells it:
// "avx2", "sse4.2") says are absent, in the order of the levels. Nothing for "native",
// "default" or a name it does not know: those are not checked.
std::vector<std::string> MissingIsaFeatures(const std::string& isa,
                                            const std::function<bool(const char*)>& cpu_has);

// OK when this CPU has every feature BuildIsa() needs; "native" and "default" are not checked
// (the build machine's own, or the compiler's baseline). Else FailedPrecondition naming the
// missing features and the build option that makes a binary for this CPU.
absl::Status CheckCpuRunsBuildIsa();

// The line `freeride version` shows: the instruction set and whether this CPU runs it.
std::string BuildIsaSummary();

}  // namespace freeride
