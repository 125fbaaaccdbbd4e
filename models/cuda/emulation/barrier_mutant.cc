// A barrier mutant without a rebuild: FREERIDE_EMULATE_SKIP_BARRIER=FILE:LINE makes the
// __syncthreads() or __syncwarp() called on that line return at once, as if it were deleted
// from the source, in every kernel and instantiation that reaches it. Deleting it at run time
// lets tests/scripts/emulation_mutants.sh try every barrier against the emulation build's own
// binaries instead of rebuilding a copy of the tree for each.
#include "models/cuda/emulation/barrier_mutant.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "models/cuda/emulation/device.h"

namespace freeride::emu {
namespace {

std::string_view BaseName(std::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

struct Skipped {
  // 0: no barrier is skipped. Read at every barrier, so the cheap test comes first.
  std::atomic<unsigned> line{0};
  std::string file;
  std::atomic<int64_t> calls{0};
  bool from_environment = false;
};

// Never destroyed: kernels on stream threads may still reach a barrier while statics go.
Skipped& TheSkipped() {
  static Skipped* skipped = [] {
    auto* s = new Skipped;
    const char* value = std::getenv("FREERIDE_EMULATE_SKIP_BARRIER");
    if (value == nullptr || *value == '\0') return s;
    const std::optional<BarrierSite> site = ParseBarrierSite(value);
    if (!site) {
      std::fprintf(stderr,
                   "FREERIDE_EMULATE_SKIP_BARRIER=%s: expected FILE:LINE, the base name of a "
                   "kernel source and a line number above 0 (flash_attention.cu:259)\n",
                   value);
      std::exit(2);
    }
    s->file = site->file;
    s->line = site->line;
    s->from_environment = true;
    return s;
  }();
  return *skipped;
}

// Reads the environment at start (a bad value stops the process before any test runs) and
// reports at exit for the mutant script: a test that passes with the barrier deleted either
// cannot see it or never reached it, and only the count tells which.
struct ExitReport {
  ExitReport() { TheSkipped(); }
  ~ExitReport() {
    const Skipped& s = TheSkipped();
    if (s.from_environment) {
      std::fprintf(stderr, "freeride CUDA emulation: skipped the barrier at %s:%u %lld times\n",
                   s.file.c_str(), s.line.load(), static_cast<long long>(s.calls.load()));
    }
  }
} exit_report;

}  // namespace

std::optional<BarrierSite> ParseBarrierSite(std::string_view value) {
  const size_t colon = value.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return std::nullopt;
  const std::string_view file = value.substr(0, colon), digits = value.substr(colon + 1);
  if (file.find('/') != std::string_view::npos || digits.empty() || digits.size() > 9) {
    return std::nullopt;
  }
  unsigned line = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    line = line * 10 + static_cast<unsigned>(c - '0');
  }
  if (line == 0) return std::nullopt;
  return BarrierSite{std::string(file), line};
}

void SetSkippedBarrier(const std::optional<BarrierSite>& site) {
  Skipped& s = TheSkipped();
  s.line = 0;
  s.calls = 0;
  if (site) {
    s.file = site->file;
    s.line = site->line;
  }
}

int64_t SkippedBarrierCalls() { return TheSkipped().calls.load(); }

bool SkipsBarrier(const std::source_location& where) {
  Skipped& s = TheSkipped();
  if (s.line.load(std::memory_order_relaxed) != where.line()) return false;
  if (BaseName(where.file_name()) != s.file) return false;
  s.calls.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace freeride::emu
