#include "core/cpu_isa.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/build_config.h"

namespace freeride {
namespace {

// The features of each x86-64 level that GCC's and clang's __builtin_cpu_supports both know
// (x86-64-v3 adds F16C, MOVBE and LZCNT too, which no CPU with AVX2 and FMA lacks).
constexpr const char* kV2Features[] = {"sse3", "ssse3", "sse4.1", "sse4.2", "popcnt"};
constexpr const char* kV3Features[] = {"avx", "avx2", "fma", "bmi", "bmi2"};

// This CPU, for the features above (__builtin_cpu_supports takes only a literal).
bool ThisCpuHas(const char* feature) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  const std::string f = feature;
  if (f == "sse3") return __builtin_cpu_supports("sse3");
  if (f == "ssse3") return __builtin_cpu_supports("ssse3");
  if (f == "sse4.1") return __builtin_cpu_supports("sse4.1");
  if (f == "sse4.2") return __builtin_cpu_supports("sse4.2");
  if (f == "popcnt") return __builtin_cpu_supports("popcnt");
  if (f == "avx") return __builtin_cpu_supports("avx");
  if (f == "avx2") return __builtin_cpu_supports("avx2");
  if (f == "fma") return __builtin_cpu_supports("fma");
  if (f == "bmi") return __builtin_cpu_supports("bmi");
  if (f == "bmi2") return __builtin_cpu_supports("bmi2");
#endif
  (void)feature;
  return false;
}

}  // namespace

std::vector<std::string> MissingIsaFeatures(const std::string& isa,
                                            const std::function<bool(const char*)>& cpu_has) {
  const bool v3 = isa == "x86-64-v3", v2 = v3 || isa == "x86-64-v2";
  std::vector<std::string> missing;
  auto check = [&](bool wanted, const auto& features) {
    for (const char* f : features) {
      if (wanted && !cpu_has(f)) missing.push_back(f);
    }
  };
  check(v2, kV2Features);
  check(v3, kV3Features);
  return missing;
}

const char* BuildIsa() { return FREERIDE_ISA; }

absl::Status CheckCpuRunsBuildIsa() {
  const std::vector<std::string> missing = MissingIsaFeatures(BuildIsa(), ThisCpuHas);
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
