#include "core/cuda_check.h"

#include "absl/strings/str_cat.h"

namespace freeride {

absl::Status CudaStatus(cudaError_t code, const char* expr, const char* file, int line) {
  absl::StatusCode status_code = absl::StatusCode::kInternal;
  switch (code) {
    case cudaErrorMemoryAllocation:
      status_code = absl::StatusCode::kResourceExhausted;
      break;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
      status_code = absl::StatusCode::kUnavailable;
      break;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
      status_code = absl::StatusCode::kInvalidArgument;
      break;
    default:
      break;
  }
  return LibraryError(status_code, "CUDA", code,
                      absl::StrCat(cudaGetErrorName(code), ": ", cudaGetErrorString(code)), expr,
                      file, line);
}

absl::Status CublasStatus(cublasStatus_t code, const char* expr, const char* file, int line) {
  absl::StatusCode status_code = code == CUBLAS_STATUS_ALLOC_FAILED
                                     ? absl::StatusCode::kResourceExhausted
                                 : code == CUBLAS_STATUS_INVALID_VALUE
                                     ? absl::StatusCode::kInvalidArgument
                                 : code == CUBLAS_STATUS_NOT_SUPPORTED
                                     ? absl::StatusCode::kUnimplemented
                                     : absl::StatusCode::kInternal;
  return LibraryError(status_code, "cuBLAS", code,
                      absl::StrCat(cublasGetStatusName(code), ": ", cublasGetStatusString(code)),
                      expr, file, line);
}

#ifdef FREERIDE_WITH_CUDNN
absl::Status CudnnStatus(cudnnStatus_t code, const char* expr, const char* file, int line) {
  absl::StatusCode status_code = code == CUDNN_STATUS_ALLOC_FAILED
                                     ? absl::StatusCode::kResourceExhausted
                                 : code == CUDNN_STATUS_BAD_PARAM
                                     ? absl::StatusCode::kInvalidArgument
                                 : code == CUDNN_STATUS_NOT_SUPPORTED
                                     ? absl::StatusCode::kUnimplemented
                                     : absl::StatusCode::kInternal;
  return LibraryError(status_code, "cuDNN", code, cudnnGetErrorString(code), expr, file, line);
}
#endif

#ifdef FREERIDE_WITH_NCCL
absl::Status NcclStatus(ncclResult_t code, const char* expr, const char* file, int line) {
  absl::StatusCode status_code = code == ncclInvalidArgument || code == ncclInvalidUsage
                                     ? absl::StatusCode::kInvalidArgument
                                 : code == ncclRemoteError ? absl::StatusCode::kUnavailable
                                                           : absl::StatusCode::kInternal;
  return LibraryError(status_code, "NCCL", code, ncclGetErrorString(code), expr, file, line);
}
#endif

CudaLibraryVersions GetCudaLibraryVersions() {
  CudaLibraryVersions v;
  if (cudaRuntimeGetVersion(&v.runtime) != cudaSuccess) v.runtime = 0;
  if (cudaDriverGetVersion(&v.driver) != cudaSuccess) v.driver = 0;
#ifdef FREERIDE_WITH_CUDNN
  v.cudnn = cudnnGetVersion();
#endif
#ifdef FREERIDE_WITH_NCCL
  if (ncclGetVersion(&v.nccl) != ncclSuccess) v.nccl = 0;
#endif
  v.cublaslt = static_cast<int>(cublasLtGetVersion());
  return v;
}

std::string FormatCudaVersion(int version) {
  return absl::StrCat(version / 1000, ".", (version % 1000) / 10);
}

}  // namespace freeride
