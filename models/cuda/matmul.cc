#include "models/cuda/matmul.h"

#include <type_traits>

#include "core/cuda_check.h"

namespace freeride::cuda {
namespace {

template <typename T>
constexpr cudaDataType_t DataType() {
  return std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_16BF;
}

// The descriptors of one cuBLASLt product, destroyed on every path out.
struct LtDescriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  ~LtDescriptors() {
    if (preference) cublasLtMatmulPreferenceDestroy(preference);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// D (m×n, column-major) = op(A) · op(B) (+ D when accumulate), with an optional epilogue.
// Row-major callers pass their products transposed (see the public functions).
absl::Status LtMatmul(const BlasContext& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n,
                      int64_t k, const void* A, cudaDataType_t a_type, int64_t lda,
                      const void* B, cudaDataType_t b_type, int64_t ldb, void* D,
                      cudaDataType_t d_type, int64_t ldd, bool accumulate,
                      cublasLtEpilogue_t epilogue, const void* bias, void* aux, int64_t aux_ld) {
  LtDescriptors desc;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                              sizeof(op_a)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                              sizeof(op_b)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                              sizeof(epilogue)));
  if (bias != nullptr) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                &bias, sizeof(bias)));
  }
  if (aux != nullptr) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                &aux_ld, sizeof(aux_ld)));
  }
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc.a, a_type, trans_a ? k : m, trans_a ? m : k, lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc.b, b_type, trans_b ? n : k, trans_b ? k : n, ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc.d, d_type, m, n, ldd));
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&desc.preference));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      desc.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ctx.workspace_bytes,
      sizeof(ctx.workspace_bytes)));
  cublasLtMatmulHeuristicResult_t heuristic;
  int found = 0;
  CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(ctx.lt, desc.op, desc.a, desc.b, desc.d, desc.d,
                                              desc.preference, 1, &heuristic, &found));
  if (found == 0) {
    return absl::InternalError(
        "cuBLASLt has no algorithm for a product of this shape, types and epilogue");
  }
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  CUBLAS_CHECK(cublasLtMatmul(ctx.lt, desc.op, &alpha, A, desc.a, B, desc.b, &beta, D, desc.d, D,
                              desc.d, &heuristic.algo, ctx.workspace, ctx.workspace_bytes,
                              ctx.stream));
  return absl::OkStatus();
}

}  // namespace

// Row-major out [N, OC] is column-major outᵀ (OC × N) = W (read as C × OC, transposed) · inpᵀ.
template <typename T>
absl::Status MatmulForward(const BlasContext& ctx, T* out, const T* inp, const T* weight,
                           const T* bias, int64_t N, int64_t C, int64_t OC, GeluFusion gelu,
                           T* pre_gelu) {
  cublasLtEpilogue_t epilogue = bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  if (gelu == GeluFusion::kForward) {
    epilogue = bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  }
  return LtMatmul(ctx, true, false, OC, N, C, weight, DataType<T>(), C, inp, DataType<T>(), C,
                  out, DataType<T>(), OC, false, epilogue, bias,
                  gelu == GeluFusion::kForward ? pre_gelu : nullptr, OC);
}

// dinpᵀ (C × N) = W (C × OC) · doutᵀ (OC × N).
template <typename T>
absl::Status MatmulBackwardInput(const BlasContext& ctx, T* dinp, const T* dout, const T* weight,
                                 int64_t N, int64_t C, int64_t OC, GeluFusion gelu,
                                 const T* pre_gelu) {
  const bool dgelu = gelu == GeluFusion::kBackward;
  return LtMatmul(ctx, false, false, C, N, OC, weight, DataType<T>(), C, dout, DataType<T>(), OC,
                  dinp, DataType<T>(), C, false,
                  dgelu ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT, nullptr,
                  dgelu ? const_cast<T*>(pre_gelu) : nullptr, C);
}

// dWᵀ... in column-major the [OC, C] weight is C × OC: dW (C × OC) += inpᵀ-major (C × N) ·
// dout (N × OC, i.e. doutᵀ transposed).
template <typename T>
absl::Status MatmulBackwardWeight(const BlasContext& ctx, float* dweight, const T* dout,
                                  const T* inp, int64_t N, int64_t C, int64_t OC) {
  return LtMatmul(ctx, false, true, C, OC, N, inp, DataType<T>(), C, dout, DataType<T>(), OC,
                  dweight, CUDA_R_32F, C, true, CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0);
}

// Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: the same call with the
// operands swapped.
template <typename T>
absl::Status BatchedGemm(const BlasContext& ctx, bool trans_a, bool trans_b, int64_t M,
                         int64_t N, int64_t K, float alpha, const T* A, int64_t lda,
                         int64_t stride_a, const T* B, int64_t ldb, int64_t stride_b, float beta,
                         T* C, int64_t ldc, int64_t stride_c, int64_t batch) {
  CUBLAS_CHECK(cublasSetStream(ctx.blas, ctx.stream));
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      ctx.blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K,
      &alpha, B, DataType<T>(), ldb, stride_b, A, DataType<T>(), lda, stride_a, &beta, C,
      DataType<T>(), ldc, stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

#define FR_INSTANTIATE(T)                                                                      \
  template absl::Status MatmulForward<T>(const BlasContext&, T*, const T*, const T*, const T*, \
                                         int64_t, int64_t, int64_t, GeluFusion, T*);           \
  template absl::Status MatmulBackwardInput<T>(const BlasContext&, T*, const T*, const T*,     \
                                               int64_t, int64_t, int64_t, GeluFusion,          \
                                               const T*);                                      \
  template absl::Status MatmulBackwardWeight<T>(const BlasContext&, float*, const T*,          \
                                                const T*, int64_t, int64_t, int64_t);          \
  template absl::Status BatchedGemm<T>(const BlasContext&, bool, bool, int64_t, int64_t,       \
                                       int64_t, float, const T*, int64_t, int64_t, const T*,   \
                                       int64_t, int64_t, float, T*, int64_t, int64_t, int64_t);
FR_INSTANTIATE(float)
FR_INSTANTIATE(bf16)
#undef FR_INSTANTIATE

}  // namespace freeride::cuda
