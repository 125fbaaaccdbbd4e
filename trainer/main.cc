#include "core/blas_setup.h"
#include "trainer/cli.h"

int main(int argc, char** argv) {
  freeride::UseBestBlasKernels(argv);
  return freeride::RunCli(std::vector<std::string>(argv + 1, argv + argc));
}
