#include "core/cpu_isa.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/build_config.h"

namespace freeride {
namespace {

// The features of each x86-64 level that GCC's and clang's __builtin_cpu_supports both know
// (x86-64-v3 adds F16C, MOVBE and LZCNT too, which no CPU with AVX2 and FMA lacks).
std::vector<const char*> MissingFeatures(const char* isa) {
  std::vector<const char*> missing;
#if defined(__x86_64__)
  const bool v3 = std::strcmp(isa, "x86-64-v3") == 0;
  const bool v2 = v3 || std::strcmp(isa, "x86-64-v2") == 0;
  __builtin_cpu_init();
  auto need = [&](bool wanted, const char* name, bool present) {
    if (wanted && !present) missing.push_back(name);
  };
  need(v2, "sse3", __builtin_cpu_supports("sse3"));
  need(v2, "ssse3", __builtin_cpu_supports("ssse3"));
  need(v2, "sse4.1", __builtin_cpu_supports("sse4.1"));
  need(v2, "sse4.2", __builtin_cpu_supports("sse4.2"));
  need(v2, "popcnt", __builtin_cpu_supports("popcnt"));
  need(v3, "avx", __builtin_cpu_supports("avx"));
  need(v3, "avx2", __builtin_cpu_supports("avx2"));
  need(v3, "fma", __builtin_cpu_supports("fma"));
  need(v3, "bmi", __builtin_cpu_supports("bmi"));
  need(v3, "bmi2", __builtin_cpu_supports("bmi2"));
#else
  (void)isa;
#endif
  return missing;
}

}  // namespace

const char* BuildIsa() { return FREERIDE_ISA; }

absl::Status CheckCpuRunsBuildIsa() {
  const std::vector<const char*> missing = MissingFeatures(BuildIsa());
  if (missing.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("this binary's CPU kernels are compiled for ", BuildIsa(),
                   " and this CPU lacks ", absl::StrJoin(missing, ", "),
                   ": build it with -DFREERIDE_ISA=x86-64-v2 (or x86-64, or native) for this CPU"));
}

std::string BuildIsaSummary() {
  const std::string isa = BuildIsa();
  if (isa == "native") return "native (the build machine's own; not checked here)";
  if (isa == "default") return "default (the compiler's baseline)";
  const absl::Status runs = CheckCpuRunsBuildIsa();
  return absl::StrCat(isa, runs.ok() ? " (this CPU has it)" : " (this CPU LACKS it)");
}

}  // namespace freeride
