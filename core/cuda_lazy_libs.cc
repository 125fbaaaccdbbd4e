// The CUDA libraries the backend calls (cuBLAS, cuBLASLt, NCCL, cuDNN), loaded on first use
// instead of when the program starts. Linked normally, every command of a CUDA build, `--help`
// included, paid for loading and relocating them (about 800 MB of shared objects: 0.2-0.6 s)
// though most commands never touch a device. Each function the project calls is defined here
// with the library's own signature; its first call opens the library (the file the build found,
// FREERIDE_*_LIBRARY) and looks the function up, and later calls go straight to it. The CUDA
// runtime is linked statically (CUDA::cudart_static), which opens the driver only at its first
// call. Not part of the emulation build, whose cuBLAS(Lt) is its own and has no NCCL or cuDNN.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#ifdef FREERIDE_WITH_CUDNN
#include <cudnn.h>
#endif

namespace {

struct Library {
  explicit Library(const char* library_path) : path(library_path) {}
  const char* path;
  std::once_flag opened;
  void* handle = nullptr;
};

Library cublas(FREERIDE_CUBLAS_LIBRARY);
Library cublas_lt(FREERIDE_CUBLASLT_LIBRARY);
Library nccl(FREERIDE_NCCL_LIBRARY);
#ifdef FREERIDE_WITH_CUDNN
Library cudnn(FREERIDE_CUDNN_LIBRARY);
#endif

// A library that cannot be opened, or lacks a function the build linked against, leaves
// nothing to return: the call cannot be made, so the process says which and stops.
void* Symbol(Library& library, const char* name) {
  std::call_once(library.opened, [&] { library.handle = dlopen(library.path, RTLD_NOW); });
  if (library.handle == nullptr) {
    std::fprintf(stderr, "error: the CUDA backend cannot load %s (%s)\n", library.path, dlerror());
    std::abort();
  }
  void* symbol = dlsym(library.handle, name);
  if (symbol == nullptr) {
    std::fprintf(stderr, "error: %s has no %s (%s)\n", library.path, name, dlerror());
    std::abort();
  }
  return symbol;
}

}  // namespace

// The body of each function below: look `name` up once (its name after the headers' macros,
// cublasCreate → cublasCreate_v2) as a pointer of `type`, then call it with the arguments.
// FR_LAZY takes the type from the header's declaration; FR_LAZY_AS names it where C++ sees
// an overload (the header's inline cublasGemmStridedBatchedEx of the older compute type).
#define FR_LAZY_NAME(name) #name
#define FR_LAZY_AS(library, name, type, ...)                                          \
  static const auto fn = reinterpret_cast<type>(Symbol(library, FR_LAZY_NAME(name))); \
  return fn(__VA_ARGS__)
#define FR_LAZY(library, name, ...) FR_LAZY_AS(library, name, decltype(&name), __VA_ARGS__)

cublasStatus_t cublasCreate(cublasHandle_t* handle) { FR_LAZY(cublas, cublasCreate, handle); }
cublasStatus_t cublasDestroy(cublasHandle_t handle) { FR_LAZY(cublas, cublasDestroy, handle); }
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  FR_LAZY(cublas, cublasSetStream, handle, stream);
}
cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream) {
  FR_LAZY(cublas, cublasGetStream, handle, stream);
}
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, size_t bytes) {
  FR_LAZY(cublas, cublasSetWorkspace, handle, workspace, bytes);
}
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void* alpha, const void* a, cudaDataType a_type,
                                          int lda, long long int stride_a, const void* b,
                                          cudaDataType b_type, int ldb, long long int stride_b,
                                          const void* beta, void* c, cudaDataType c_type, int ldc,
                                          long long int stride_c, int batch_count,
                                          cublasComputeType_t compute_type, cublasGemmAlgo_t algo) {
  using Fn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                int, const void*, const void*, cudaDataType, int, long long int,
                                const void*, cudaDataType, int, long long int, const void*, void*,
                                cudaDataType, int, long long int, int, cublasComputeType_t,
                                cublasGemmAlgo_t);
  FR_LAZY_AS(cublas, cublasGemmStridedBatchedEx, Fn, handle, transa, transb, m, n, k, alpha, a,
             a_type, lda, stride_a, b, b_type, ldb, stride_b, beta, c, c_type, ldc, stride_c,
             batch_count, compute_type, algo);
}
const char* cublasGetStatusName(cublasStatus_t status) {
  FR_LAZY(cublas, cublasGetStatusName, status);
}
const char* cublasGetStatusString(cublasStatus_t status) {
  FR_LAZY(cublas, cublasGetStatusString, status);
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  FR_LAZY(cublas_lt, cublasLtCreate, handle);
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  FR_LAZY(cublas_lt, cublasLtDestroy, handle);
}
size_t cublasLtGetVersion(void) { FR_LAZY(cublas_lt, cublasLtGetVersion); }
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  FR_LAZY(cublas_lt, cublasLtMatmulDescCreate, desc, compute, scale);
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  FR_LAZY(cublas_lt, cublasLtMatmulDescDestroy, desc);
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t bytes) {
  FR_LAZY(cublas_lt, cublasLtMatmulDescSetAttribute, desc, attr, buf, bytes);
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  FR_LAZY(cublas_lt, cublasLtMatrixLayoutCreate, layout, type, rows, cols, ld);
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  FR_LAZY(cublas_lt, cublasLtMatrixLayoutDestroy, layout);
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  FR_LAZY(cublas_lt, cublasLtMatmulPreferenceCreate, pref);
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  FR_LAZY(cublas_lt, cublasLtMatmulPreferenceDestroy, pref);
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t bytes) {
  FR_LAZY(cublas_lt, cublasLtMatmulPreferenceSetAttribute, pref, attr, buf, bytes);
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* returned) {
  FR_LAZY(cublas_lt, cublasLtMatmulAlgoGetHeuristic, handle, desc, a, b, c, d, pref, requested,
          results, returned);
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* a, cublasLtMatrixLayout_t a_desc, const void* b,
                              cublasLtMatrixLayout_t b_desc, const void* beta, const void* c,
                              cublasLtMatrixLayout_t c_desc, void* d, cublasLtMatrixLayout_t d_desc,
                              const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  FR_LAZY(cublas_lt, cublasLtMatmul, handle, desc, alpha, a, a_desc, b, b_desc, beta, c, c_desc, d,
          d_desc, algo, workspace, workspace_bytes, stream);
}

ncclResult_t ncclGetVersion(int* version) { FR_LAZY(nccl, ncclGetVersion, version); }
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) { FR_LAZY(nccl, ncclGetUniqueId, id); }
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  FR_LAZY(nccl, ncclCommInitRank, comm, nranks, id, rank);
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  FR_LAZY(nccl, ncclCommInitRankConfig, comm, nranks, id, rank, config);
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) { FR_LAZY(nccl, ncclCommDestroy, comm); }
ncclResult_t ncclCommAbort(ncclComm_t comm) { FR_LAZY(nccl, ncclCommAbort, comm); }
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  FR_LAZY(nccl, ncclCommGetAsyncError, comm, error);
}
const char* ncclGetErrorString(ncclResult_t result) { FR_LAZY(nccl, ncclGetErrorString, result); }
ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  FR_LAZY(nccl, ncclAllReduce, send, recv, count, type, op, comm, stream);
}
ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  FR_LAZY(nccl, ncclReduce, send, recv, count, type, op, root, comm, stream);
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  FR_LAZY(nccl, ncclBroadcast, send, recv, count, type, root, comm, stream);
}
ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  FR_LAZY(nccl, ncclSend, send, count, type, peer, comm, stream);
}
ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  FR_LAZY(nccl, ncclRecv, recv, count, type, peer, comm, stream);
}
ncclResult_t ncclGroupStart() { FR_LAZY(nccl, ncclGroupStart); }
ncclResult_t ncclGroupEnd() { FR_LAZY(nccl, ncclGroupEnd); }

#ifdef FREERIDE_WITH_CUDNN
size_t cudnnGetVersion(void) { FR_LAZY(cudnn, cudnnGetVersion); }
const char* cudnnGetErrorString(cudnnStatus_t status) {
  FR_LAZY(cudnn, cudnnGetErrorString, status);
}
#endif
