#include "core/blas_setup.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

extern "C" char* openblas_get_corename(void);

namespace freeride {

const char* BlasCoreName() { return openblas_get_corename(); }

void UseBestBlasKernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  if (std::strcmp(openblas_get_corename(), "Haswell") != 0) return;
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512dq") || !__builtin_cpu_supports("avx512vl")) {
    return;
  }
  const char* core = __builtin_cpu_supports("avx512bf16") ? "Cooperlake" : "SkylakeX";
  setenv("OPENBLAS_CORETYPE", core, /*overwrite=*/1);
  execv("/proc/self/exe", argv);
}

}  // namespace freeride
