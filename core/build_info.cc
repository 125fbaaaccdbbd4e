#include "core/build_info.h"

#include "absl/base/config.h"
#include "absl/strings/str_cat.h"
#include "core/build_config.h"
#include "core/cpu_isa.h"
#include "core/mpi_check.h"

#ifdef FREERIDE_WITH_CUDA
#include "core/cuda_check.h"
#endif

// OpenBLAS's own description of itself ("OpenBLAS 0.3.21 DYNAMIC_ARCH ... Haswell MAX_THREADS=64").
extern "C" char* openblas_get_config(void);

namespace freeride {

std::vector<std::pair<std::string, std::string>> BuildInfo() {
  std::vector<std::pair<std::string, std::string>> rows;
  rows.emplace_back("freeride", FREERIDE_VERSION);
  rows.emplace_back("commit", FREERIDE_GIT_COMMIT);
  rows.emplace_back("compiler", FREERIDE_COMPILER);
  rows.emplace_back("build type", FREERIDE_BUILD_TYPE);
  rows.emplace_back("CPU kernels", BuildIsaSummary());
#ifdef FREERIDE_WITH_CUDA
  const CudaLibraryVersions v = GetCudaLibraryVersions();
#ifdef FREERIDE_CUDA_EMULATED
  rows.emplace_back("CUDA backend", "emulated on the CPU (-DFREERIDE_CUDA=EMULATE)");
#else
  rows.emplace_back("CUDA backend", absl::StrCat("on (architectures ", FREERIDE_CUDA_ARCHS, ")"));
#endif
  rows.emplace_back("CUDA runtime", FormatCudaVersion(v.runtime));
  rows.emplace_back("CUDA driver",
                    v.driver == 0 ? "none (no driver installed)" : FormatCudaVersion(v.driver));
  rows.emplace_back("cuBLASLt", absl::StrCat(v.cublaslt / 10000, ".", (v.cublaslt / 100) % 100,
                                             ".", v.cublaslt % 100));
  rows.emplace_back(
      "cuDNN", v.cudnn == 0
                   ? std::string("not built in")
                   : absl::StrCat(v.cudnn / 10000, ".", (v.cudnn / 100) % 100, ".", v.cudnn % 100));
#ifdef FREERIDE_CUDA_EMULATED
  const char* nccl_kind = " (emulated between threads)";
#else
  const char* nccl_kind = "";
#endif
  rows.emplace_back("NCCL", absl::StrCat(v.nccl / 10000, ".", (v.nccl / 100) % 100, ".",
                                         v.nccl % 100, nccl_kind));
#else
  rows.emplace_back("CUDA backend", "off");
#endif
  rows.emplace_back("MPI", MpiLibraryVersion());
  rows.emplace_back("BLAS", openblas_get_config());
  rows.emplace_back("abseil", absl::StrCat("LTS ", ABSL_LTS_RELEASE_VERSION, ".",
                                           ABSL_LTS_RELEASE_PATCH_LEVEL));
  rows.emplace_back("toml++", FREERIDE_TOMLPP_VERSION);
  return rows;
}

}  // namespace freeride
