// MPI_CHECK: turns an MPI return code into an absl::Status carrying MPI's own error string.
// Communicators used by freeride are set to MPI_ERRORS_RETURN so that codes reach here.
#pragma once

#include <mpi.h>

#include "core/status.h"

namespace freeride {

absl::Status MpiStatus(int code, const char* expr, const char* file, int line);

// The MPI library's own version line, e.g. "Open MPI v4.1.4, ...". Callable before MPI_Init.
std::string MpiLibraryVersion();

}  // namespace freeride

#define MPI_CHECK(expr)                                                        \
  do {                                                                         \
    int fr_mpi_code_ = (expr);                                                 \
    if (fr_mpi_code_ != MPI_SUCCESS)                                           \
      return ::freeride::MpiStatus(fr_mpi_code_, #expr, __FILE__, __LINE__);   \
  } while (0)
