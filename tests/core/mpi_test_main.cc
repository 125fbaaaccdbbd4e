// main() for suites that need MPI up: initialises MPI (a singleton world when run without
// mpirun), runs the tests, finalises.
#include <mpi.h>

#include "gtest/gtest.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  testing::InitGoogleTest(&argc, argv);
  int result = RUN_ALL_TESTS();
  MPI_Finalize();
  return result;
}
