#include "core/mpi_check.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace freeride {

absl::Status MpiStatus(int code, const char* expr, const char* file, int line) {
  // MPI's own text when MPI is up; before MPI_Init (or after MPI_Finalize) Open MPI aborts on
  // MPI_Error_string, so only the number is reported then.
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  std::string description = "MPI not initialised, no error text";
  int error_class = code;
  if (initialized && !finalized) {
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    if (MPI_Error_string(code, text, &length) == MPI_SUCCESS) description.assign(text, length);
    MPI_Error_class(code, &error_class);
  }
  absl::StatusCode status_code = absl::StatusCode::kInternal;
  if (error_class == MPI_ERR_ARG || error_class == MPI_ERR_COUNT ||
      error_class == MPI_ERR_RANK || error_class == MPI_ERR_TAG || error_class == MPI_ERR_TYPE ||
      error_class == MPI_ERR_COMM || error_class == MPI_ERR_BUFFER) {
    status_code = absl::StatusCode::kInvalidArgument;
  } else if (error_class == MPI_ERR_NO_MEM) {
    status_code = absl::StatusCode::kResourceExhausted;
  }
  return LibraryError(status_code, "MPI", code, description, expr, file, line);
}

std::string MpiLibraryVersion() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  if (MPI_Get_library_version(text, &length) != MPI_SUCCESS) return "unknown";
  std::string version(text, length);
  // Open MPI appends build details after the first line; the first line says enough.
  if (auto newline = version.find_first_of("\r\n"); newline != std::string::npos) {
    version.resize(newline);
  }
  while (!version.empty() && (version.back() == ',' || version.back() == ' ')) version.pop_back();
  return version;
}

}  // namespace freeride
