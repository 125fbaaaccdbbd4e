// A barrier deleted at run time, for the barrier mutants (barrier_mutant.cc,
// FREERIDE_EMULATE_SKIP_BARRIER=FILE:LINE): what tests set and read of it. The barriers
// themselves ask SkipsBarrier (device.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace freeride::emu {

// The barrier called on `line` of the source whose base name is `file`.
struct BarrierSite {
  std::string file;
  unsigned line;
};
// "flash_attention.cu:259"; nullopt for anything else (a path, no line, line 0).
std::optional<BarrierSite> ParseBarrierSite(std::string_view value);
// For tests, between launches: skips the barrier at `site` from now on (nullopt: none) and
// restarts the count of skipped calls.
void SetSkippedBarrier(const std::optional<BarrierSite>& site);
// How many barrier calls were skipped since the environment or the last SetSkippedBarrier.
int64_t SkippedBarrierCalls();

}  // namespace freeride::emu
