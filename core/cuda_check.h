// Check macros for the CUDA runtime, cuBLAS(Lt), cuDNN and NCCL: each turns the library's error
// code into an absl::Status with the library's own error text, the expression and file:line,
// and returns it from the enclosing function. Only built with the CUDA backend; cuDNN's only
// where it was found (FREERIDE_WITH_CUDNN).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#ifdef FREERIDE_WITH_NCCL
#include <nccl.h>
#endif
#ifdef FREERIDE_WITH_CUDNN
#include <cudnn.h>
#endif

#include <string>

#include "core/status.h"

namespace freeride {

absl::Status CudaStatus(cudaError_t code, const char* expr, const char* file, int line);
absl::Status CublasStatus(cublasStatus_t code, const char* expr, const char* file, int line);
#ifdef FREERIDE_WITH_CUDNN
absl::Status CudnnStatus(cudnnStatus_t code, const char* expr, const char* file, int line);
#endif
#ifdef FREERIDE_WITH_NCCL
absl::Status NcclStatus(ncclResult_t code, const char* expr, const char* file, int line);
#endif

// Versions of the CUDA libraries this binary loaded; none of these needs a driver.
struct CudaLibraryVersions {
  int runtime = 0;  // e.g. 13000
  int driver = 0;   // 0 when no driver is installed
  size_t cudnn = 0;  // 0 in a build without cuDNN
  int nccl = 0;
  int cublaslt = 0;
};
CudaLibraryVersions GetCudaLibraryVersions();
std::string FormatCudaVersion(int version);  // 13000 -> "13.0"

}  // namespace freeride

#define FR_LIBRARY_CHECK(type, ok_value, to_status, expr)                   \
  do {                                                                      \
    type fr_lib_code_ = (expr);                                             \
    if (fr_lib_code_ != (ok_value))                                         \
      return ::freeride::to_status(fr_lib_code_, #expr, __FILE__, __LINE__); \
  } while (0)

#define CUDA_CHECK(expr) FR_LIBRARY_CHECK(cudaError_t, cudaSuccess, CudaStatus, expr)
#define CUBLAS_CHECK(expr) \
  FR_LIBRARY_CHECK(cublasStatus_t, CUBLAS_STATUS_SUCCESS, CublasStatus, expr)
#ifdef FREERIDE_WITH_CUDNN
#define CUDNN_CHECK(expr) FR_LIBRARY_CHECK(cudnnStatus_t, CUDNN_STATUS_SUCCESS, CudnnStatus, expr)
#endif
#ifdef FREERIDE_WITH_NCCL
#define NCCL_CHECK(expr) FR_LIBRARY_CHECK(ncclResult_t, ncclSuccess, NcclStatus, expr)
#endif
