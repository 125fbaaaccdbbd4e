// cuBLAS as the emulation build sees it (-DFREERIDE_CUDA=EMULATE): the handle, the status codes
// and the one product the project calls (cublasGemmStridedBatchedEx, attention's batched
// GEMMs), with CUDA's names and numeric values, implemented on the CPU by
// models/cuda/emulation/blas.cc. Only what the project uses is declared.
#pragma once

#include <cstddef>

#include "models/cuda/emulation/include/cuda_runtime_api.h"
#include "models/cuda/emulation/include/library_types.h"

enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
  CUBLAS_STATUS_LICENSE_ERROR = 16,
};

// CUBLAS_OP_C is CUBLAS_OP_T for the real types the emulator knows.
enum cublasOperation_t {
  CUBLAS_OP_N = 0,
  CUBLAS_OP_T = 1,
  CUBLAS_OP_C = 2,
};

enum cublasComputeType_t {
  CUBLAS_COMPUTE_16F = 64,
  CUBLAS_COMPUTE_16F_PEDANTIC = 65,
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_PEDANTIC = 69,
  CUBLAS_COMPUTE_64F = 70,
  CUBLAS_COMPUTE_64F_PEDANTIC = 71,
  CUBLAS_COMPUTE_32I = 72,
  CUBLAS_COMPUTE_32I_PEDANTIC = 73,
  CUBLAS_COMPUTE_32F_FAST_16F = 74,
  CUBLAS_COMPUTE_32F_FAST_16BF = 75,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
};

enum cublasGemmAlgo_t {
  CUBLAS_GEMM_DEFAULT = -1,
  CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99,
};

struct cublasContext;
using cublasHandle_t = cublasContext*;

const char* cublasGetStatusName(cublasStatus_t status);
const char* cublasGetStatusString(cublasStatus_t status);

cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
// As in cuBLAS, setting the stream also drops a workspace given by cublasSetWorkspace.
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream);
// The workspace must be 256-byte aligned (INVALID_VALUE otherwise); the emulator never uses it.
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, size_t bytes);

// C[i] = alpha · op(A[i]) · op(B[i]) + beta · C[i], column-major, i < batchCount, strides in
// elements; alpha and beta are host floats read at the call. Types: all CUDA_R_32F, all
// CUDA_R_16BF, or CUDA_R_16BF A and B with a CUDA_R_32F C; compute CUBLAS_COMPUTE_32F.
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void* alpha, const void* A, cudaDataType_t Atype,
                                          int lda, long long strideA, const void* B,
                                          cudaDataType_t Btype, int ldb, long long strideB,
                                          const void* beta, void* C, cudaDataType_t Ctype, int ldc,
                                          long long strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo);
