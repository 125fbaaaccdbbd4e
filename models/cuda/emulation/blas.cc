// The emulated cuBLAS and cuBLASLt (-DFREERIDE_CUDA=EMULATE): a reference implementation of
// the calls the project makes. Arguments are checked at the call, as the libraries do; the
// arithmetic runs later, in stream order, through freeride::emu::Enqueue, on a copy of
// everything it needs (the caller may destroy its descriptors and host scalars at once).
// The arithmetic itself is gemm.h's.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "models/cuda/emulation/gemm.h"
#include "models/cuda/emulation/include/cublasLt.h"
#include "models/cuda/emulation/include/cublas_v2.h"
#include "models/cuda/emulation/include/cuda_bf16.h"
#include "models/cuda/emulation/runtime.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

struct cublasLtContext {};

struct cublasLtMatmulDescOpaque_t {
  int32_t compute = CUBLAS_COMPUTE_32F, scale = CUDA_R_32F;
  int32_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  void* aux = nullptr;
  int64_t aux_ld = 0;
};

struct cublasLtMatrixLayoutOpaque_t {
  cudaDataType_t type = CUDA_R_32F;
  int64_t rows = 0, cols = 0, ld = 0;
};

struct cublasLtMatmulPreferenceOpaque_t {
  uint64_t max_workspace_bytes = 0;                  // the emulator needs none
  uint32_t min_alignment[4] = {256, 256, 256, 256};  // A, B, C, D: cuBLASLt's defaults
};

namespace freeride::emu {
namespace {

// Marks the algorithms our heuristic hands out, so that a garbage algo is refused.
constexpr uint64_t kAlgoTag = 0x667265656d75626cull;
constexpr int64_t kIntMax = std::numeric_limits<int>::max();  // cblas_sgemm takes int sizes

bool IsOperandType(cudaDataType_t t) { return t == CUDA_R_32F || t == CUDA_R_16BF; }

// fp32 throughout, bf16 throughout, or bf16 operands into an fp32 result: what the project
// asks for (C is always D's type).
bool SupportedTypes(cudaDataType_t a, cudaDataType_t b, cudaDataType_t c, cudaDataType_t d) {
  return IsOperandType(a) && a == b && c == d && (d == a || d == CUDA_R_32F);
}

bool SupportedEpilogue(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_DEFAULT || HasBias(e) || HasAux(e);
}

// Whether `batch` column-major rows × cols matrices at p (leading dimension ld, `stride`
// elements apart) are element-aligned and lie in one device allocation. Empty ones pass.
bool DeviceMatrix(const void* p, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                  int64_t batch = 1, int64_t stride = 0) {
  if (rows == 0 || cols == 0 || batch == 0) return true;
  const size_t size = ElementSize(type);
  if (p == nullptr || reinterpret_cast<uintptr_t>(p) % size != 0) return false;
  const int64_t extent = (cols - 1) * ld + rows;
  const int64_t last = (batch - 1) * stride;
  const int64_t low = std::min<int64_t>(0, last), high = std::max<int64_t>(0, last) + extent;
  return IsDeviceMemory(static_cast<const char*>(p) + low * static_cast<int64_t>(size),
                        static_cast<size_t>(high - low) * size);
}

// Whether the pointers a product reads and writes are device memory it may touch.
bool DevicePointers(const Gemm& g, int64_t batch = 1, int64_t stride_a = 0, int64_t stride_b = 0,
                    int64_t stride_c = 0) {
  if (g.m == 0 || g.n == 0) return true;
  if (g.k > 0 && g.alpha != 0.0f &&
      (!DeviceMatrix(g.a.p, g.a.type, g.a.trans ? g.k : g.m, g.a.trans ? g.m : g.k, g.a.ld, batch,
                     stride_a) ||
       !DeviceMatrix(g.b.p, g.b.type, g.b.trans ? g.n : g.k, g.b.trans ? g.k : g.n, g.b.ld, batch,
                     stride_b))) {
    return false;
  }
  if (g.beta != 0.0f && !DeviceMatrix(g.c, g.out_type, g.m, g.n, g.ldc, batch, stride_c)) {
    return false;
  }
  return DeviceMatrix(g.d, g.out_type, g.m, g.n, g.ldd, batch, stride_c) &&
         (!HasBias(g.epilogue) || DeviceMatrix(g.bias, g.out_type, g.m, 1, g.m)) &&
         (!HasAux(g.epilogue) || DeviceMatrix(g.aux, g.out_type, g.m, g.n, g.aux_ld));
}

// The product a descriptor and four layouts describe (pointers and scalars aside), or why
// cuBLASLt would refuse it: INVALID_VALUE for shapes that do not agree, NOT_SUPPORTED for what
// the emulator does not implement.
cublasStatus_t Describe(const cublasLtMatmulDescOpaque_t* desc,
                        const cublasLtMatrixLayoutOpaque_t* a,
                        const cublasLtMatrixLayoutOpaque_t* b,
                        const cublasLtMatrixLayoutOpaque_t* c,
                        const cublasLtMatrixLayoutOpaque_t* d, Gemm* g) {
  if (desc == nullptr || a == nullptr || b == nullptr || c == nullptr || d == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const bool ta = desc->trans_a != CUBLAS_OP_N, tb = desc->trans_b != CUBLAS_OP_N;
  const int64_t m = d->rows, n = d->cols, k = ta ? a->rows : a->cols;
  if ((ta ? a->cols : a->rows) != m || (tb ? b->cols : b->rows) != k ||
      (tb ? b->rows : b->cols) != n || c->rows != m || c->cols != n) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  for (const cublasLtMatrixLayoutOpaque_t* layout : {a, b, c, d}) {
    if (layout->ld < layout->rows) return CUBLAS_STATUS_INVALID_VALUE;
    if (layout->rows > kIntMax || layout->cols > kIntMax || layout->ld > kIntMax) {
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
  }
  if (desc->compute != CUBLAS_COMPUTE_32F || desc->scale != CUDA_R_32F ||
      !SupportedTypes(a->type, b->type, c->type, d->type) || !SupportedEpilogue(desc->epilogue)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (HasAux(desc->epilogue)) {
    if (desc->aux_ld < m) return CUBLAS_STATUS_INVALID_VALUE;
    // cuBLASLt's rule for a GELU input matrix; kept so the emulator refuses what a GPU would.
    if (desc->aux_ld % 8 != 0 || desc->aux_ld > kIntMax) return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  *g = {.m = m,
        .n = n,
        .k = k,
        .a = {nullptr, a->type, a->ld, ta},
        .b = {nullptr, b->type, b->ld, tb},
        .out_type = d->type,
        .ldc = c->ld,
        .ldd = d->ld,
        .epilogue = desc->epilogue,
        .bias = desc->bias,
        .aux = desc->aux,
        .aux_ld = desc->aux_ld};
  return CUBLAS_STATUS_SUCCESS;
}

// Copies an attribute's value out of `buf`, which must be exactly its size.
template <typename V>
bool ReadAttribute(const void* buf, size_t size, V* value) {
  if (buf == nullptr || size != sizeof(V)) return false;
  std::memcpy(value, buf, sizeof(V));
  return true;
}

// cuBLAS's own name and description of each status.
struct StatusText {
  cublasStatus_t status;
  const char* name;
  const char* text;
};
constexpr StatusText kStatusTexts[] = {
    {CUBLAS_STATUS_SUCCESS, "CUBLAS_STATUS_SUCCESS", "the operation completed successfully"},
    {CUBLAS_STATUS_NOT_INITIALIZED, "CUBLAS_STATUS_NOT_INITIALIZED",
     "the library was not initialized"},
    {CUBLAS_STATUS_ALLOC_FAILED, "CUBLAS_STATUS_ALLOC_FAILED", "the resource allocation failed"},
    {CUBLAS_STATUS_INVALID_VALUE, "CUBLAS_STATUS_INVALID_VALUE",
     "an invalid numeric value was used as an argument"},
    {CUBLAS_STATUS_ARCH_MISMATCH, "CUBLAS_STATUS_ARCH_MISMATCH",
     "an absent device architectural feature is required"},
    {CUBLAS_STATUS_MAPPING_ERROR, "CUBLAS_STATUS_MAPPING_ERROR",
     "an access to GPU memory space failed"},
    {CUBLAS_STATUS_EXECUTION_FAILED, "CUBLAS_STATUS_EXECUTION_FAILED",
     "the GPU program failed to execute"},
    {CUBLAS_STATUS_INTERNAL_ERROR, "CUBLAS_STATUS_INTERNAL_ERROR", "an internal operation failed"},
    {CUBLAS_STATUS_NOT_SUPPORTED, "CUBLAS_STATUS_NOT_SUPPORTED",
     "the functionality requested is not supported"},
    {CUBLAS_STATUS_LICENSE_ERROR, "CUBLAS_STATUS_LICENSE_ERROR",
     "error detected trying to check the license"},
};
const StatusText* FindStatus(cublasStatus_t status) {
  for (const StatusText& text : kStatusTexts) {
    if (text.status == status) return &text;
  }
  return nullptr;
}

}  // namespace
}  // namespace freeride::emu

namespace emu = freeride::emu;
using emu::Gemm;

const char* cublasGetStatusName(cublasStatus_t status) {
  const emu::StatusText* text = emu::FindStatus(status);
  return text != nullptr ? text->name : "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasGetStatusString(cublasStatus_t status) {
  const emu::StatusText* text = emu::FindStatus(status);
  return text != nullptr ? text->text : "unknown error";
}

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  handle->workspace = nullptr;
  handle->workspace_bytes = 0;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (stream == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *stream = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, size_t bytes) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0) return CUBLAS_STATUS_INVALID_VALUE;
  handle->workspace = workspace;
  handle->workspace_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void* alpha, const void* A, cudaDataType_t Atype,
                                          int lda, long long strideA, const void* B,
                                          cudaDataType_t Btype, int ldb, long long strideB,
                                          const void* beta, void* C, cudaDataType_t Ctype, int ldc,
                                          long long strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  const auto valid_op = [](cublasOperation_t op) {
    return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
  };
  if (!valid_op(transa) || !valid_op(transb) || m < 0 || n < 0 || k < 0 || batchCount < 0) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
  if (lda < std::max(1, ta ? k : m) || ldb < std::max(1, tb ? n : k) || ldc < std::max(1, m) ||
      alpha == nullptr || beta == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (computeType != CUBLAS_COMPUTE_32F || !emu::SupportedTypes(Atype, Btype, Ctype, Ctype) ||
      (algo != CUBLAS_GEMM_DEFAULT && algo != CUBLAS_GEMM_DEFAULT_TENSOR_OP)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const Gemm g{.m = m,
               .n = n,
               .k = k,
               .alpha = *static_cast<const float*>(alpha),
               .beta = *static_cast<const float*>(beta),
               .a = {A, Atype, lda, ta},
               .b = {B, Btype, ldb, tb},
               .out_type = Ctype,
               .c = C,
               .ldc = ldc,
               .d = C,
               .ldd = ldc};
  if (!emu::DevicePointers(g, batchCount, strideA, strideB, strideC)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (m == 0 || n == 0 || batchCount == 0) return CUBLAS_STATUS_SUCCESS;
  const int64_t batch = batchCount;
  const int64_t bytes_a = strideA * static_cast<int64_t>(emu::ElementSize(Atype));
  const int64_t bytes_b = strideB * static_cast<int64_t>(emu::ElementSize(Btype));
  const int64_t bytes_c = strideC * static_cast<int64_t>(emu::ElementSize(Ctype));
  emu::Enqueue(handle->stream, [g, batch, bytes_a, bytes_b, bytes_c] {
    emu::Scratch scratch;
    for (int64_t i = 0; i < batch; ++i) {
      Gemm one = g;
      one.a.p = static_cast<const char*>(g.a.p) + i * bytes_a;
      one.b.p = static_cast<const char*>(g.b.p) + i * bytes_b;
      one.d = static_cast<char*>(g.d) + i * bytes_c;
      one.c = one.d;
      emu::RunGemm(one, &scratch);
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}

// The emulator stands for the cuBLASLt 13.0 API (13.0.0 in build_info's major.minor.patch).
size_t cublasLtGetVersion() { return 130000; }

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType) {
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *desc = new cublasLtMatmulDescOpaque_t;
  (*desc)->compute = computeType;
  (*desc)->scale = scaleType;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t sizeInBytes) {
  using emu::ReadAttribute;
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  bool ok = false;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
      ok = ReadAttribute(buf, sizeInBytes, &desc->compute);
      break;
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
      ok = ReadAttribute(buf, sizeInBytes, &desc->scale);
      break;
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB: {
      int32_t v = 0;
      ok = ReadAttribute(buf, sizeInBytes, &v) && v >= CUBLAS_OP_N && v <= CUBLAS_OP_C;
      if (ok) (attr == CUBLASLT_MATMUL_DESC_TRANSA ? desc->trans_a : desc->trans_b) = v;
      break;
    }
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      ok = ReadAttribute(buf, sizeInBytes, &desc->epilogue);
      break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      ok = ReadAttribute(buf, sizeInBytes, &desc->bias);
      break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
      ok = ReadAttribute(buf, sizeInBytes, &desc->aux);
      break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
      ok = ReadAttribute(buf, sizeInBytes, &desc->aux_ld);
      break;
  }
  return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  constexpr uint64_t kMax = std::numeric_limits<int64_t>::max();
  if (layout == nullptr || rows > kMax || cols > kMax || ld < 0) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  *layout = new cublasLtMatrixLayoutOpaque_t{type, static_cast<int64_t>(rows),
                                             static_cast<int64_t>(cols), ld};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = new cublasLtMatmulPreferenceOpaque_t;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t sizeInBytes) {
  using emu::ReadAttribute;
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  bool ok = false;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      ok = ReadAttribute(buf, sizeInBytes, &pref->max_workspace_bytes);
      break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      ok = ReadAttribute(buf, sizeInBytes,
                         &pref->min_alignment[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES]);
      break;
  }
  return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount) {
  if (returnAlgoCount != nullptr) *returnAlgoCount = 0;
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (preference == nullptr || heuristicResultsArray == nullptr || returnAlgoCount == nullptr ||
      requestedAlgoCount < 1) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  Gemm g;
  const cublasStatus_t status = emu::Describe(operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &g);
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  // Every kernel needs its pointers aligned to an element at least.
  const cublasLtMatrixLayoutOpaque_t* layouts[4] = {Adesc, Bdesc, Cdesc, Ddesc};
  for (int i = 0; i < 4; ++i) {
    if (preference->min_alignment[i] < emu::ElementSize(layouts[i]->type)) {
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
  }
  cublasLtMatmulHeuristicResult_t& result = heuristicResultsArray[0];
  result = {};
  result.algo.data[0] = emu::kAlgoTag;
  result.workspaceSize = 0;
  result.state = CUBLAS_STATUS_SUCCESS;
  result.wavesCount = 1.0f;
  *returnAlgoCount = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t computeDesc,
                              const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
                              const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                              const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, size_t workspaceSizeInBytes, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  Gemm g;
  const cublasStatus_t status = emu::Describe(computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &g);
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  if (alpha == nullptr || beta == nullptr || (algo != nullptr && algo->data[0] != emu::kAlgoTag) ||
      (workspace == nullptr && workspaceSizeInBytes > 0) ||
      (C == D && Cdesc->ld != Ddesc->ld)) {  // in place, C and D must be laid out alike
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  g.alpha = *static_cast<const float*>(alpha);
  g.beta = *static_cast<const float*>(beta);
  g.a.p = A;
  g.b.p = B;
  g.c = C;
  g.d = D;
  if (!emu::DevicePointers(g)) return CUBLAS_STATUS_INVALID_VALUE;
  emu::Enqueue(stream, [g] {
    emu::Scratch scratch;
    emu::RunGemm(g, &scratch);
  });
  return CUBLAS_STATUS_SUCCESS;
}
