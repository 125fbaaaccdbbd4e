#include <iostream>

#include "core/blas_setup.h"
#include "core/cpu_isa.h"
#include "core/float_env.h"
#include "core/stop_request.h"
#include "trainer/cli/cli.h"

int main(int argc, char** argv) {
  // Before any kernel: a CPU without the build's instruction set is named, not a SIGILL.
  if (const absl::Status isa = freeride::CheckCpuRunsBuildIsa(); !isa.ok()) {
    std::cerr << "error: " << isa.message() << "\n";
    return 1;
  }
  // Before any thread exists, so that OpenMP's and OpenBLAS's threads inherit it.
  freeride::FlushSubnormalsToZero();
  freeride::UseBestBlasKernels(argv);
  // Before anything slow: a stop asked for during start-up is kept for the first step boundary.
  freeride::InstallStopHandlers();
  return freeride::RunCli(std::vector<std::string>(argv + 1, argv + argc));
}
