// main() for suites that need MPI up: initialises MPI (a singleton world when run without
// mpirun), runs the tests (with the hang watchdog), finalises.
#include <mpi.h>

#include "gtest/gtest.h"
#include "tests/support/watchdog.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  testing::InitGoogleTest(&argc, argv);
  freeride::testing::StartWatchdog(argc, argv);
  int result = RUN_ALL_TESTS();
  MPI_Finalize();
  return result;
}
