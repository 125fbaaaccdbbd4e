#include "models/cuda/matmul.h"

#include <map>
#include <type_traits>
#include <utility>

#include "absl/strings/str_format.h"
#include "core/cuda_check.h"
#include "models/cuda/gemm_shapes.h"
#include "models/cuda/stage_policy.h"

namespace freeride::cuda {

struct LtAlgorithmCache {
  // One BlasContext's answers (one device, handle and workspace size), by everything else the
  // heuristic's answer depends on.
  std::map<LtKey, cublasLtMatmulAlgo_t> algorithms;
};

std::shared_ptr<LtAlgorithmCache> MakeLtAlgorithmCache() {
  return std::make_shared<LtAlgorithmCache>();
}

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

// D = op(A) · op(B) (+ D when accumulate) as `g` describes it (gemm_shapes.h), with an
// optional epilogue.
absl::Status LtMatmul(const BlasContext& ctx, const ColumnMajorGemm& g, const void* A,
                      cudaDataType_t a_type, const void* B, cudaDataType_t b_type, void* D,
                      cudaDataType_t d_type, bool accumulate, cublasLtEpilogue_t epilogue,
                      const void* bias, void* aux, int64_t aux_ld) {
  const bool trans_a = g.trans_a, trans_b = g.trans_b;
  const int64_t m = g.m, n = g.n, k = g.k;
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
  CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&desc.a, a_type, trans_a ? k : m, trans_a ? m : k, g.lda));
  CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&desc.b, b_type, trans_b ? n : k, trans_b ? k : n, g.ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc.d, d_type, m, n, g.ldd));
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&desc.preference));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      desc.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ctx.workspace_bytes,
      sizeof(ctx.workspace_bytes)));
  // The real pointers' alignments: the heuristic otherwise assumes 256 bytes and may choose a
  // kernel that faults on less. C is D here.
  const LtKey key{trans_a,
                  trans_b,
                  m,
                  n,
                  k,
                  g.lda,
                  g.ldb,
                  g.ldd,
                  static_cast<int>(a_type),
                  static_cast<int>(b_type),
                  static_cast<int>(d_type),
                  static_cast<int>(epilogue),
                  bias != nullptr,
                  accumulate,
                  PointerAlignment(A),
                  PointerAlignment(B),
                  PointerAlignment(D)};
  for (auto [attribute, bytes] :
       {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
        std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
        std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_d},
        std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d}}) {
    CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(desc.preference, attribute, &bytes, sizeof(bytes)));
  }
  const cublasLtMatmulAlgo_t* known = nullptr;
  if (ctx.algorithms != nullptr) {
    auto it = ctx.algorithms->algorithms.find(key);
    if (it != ctx.algorithms->algorithms.end()) known = &it->second;
  }
  cublasLtMatmulAlgo_t algo;
  if (known != nullptr) {
    algo = *known;
  } else {
    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(ctx.lt, desc.op, desc.a, desc.b, desc.d, desc.d,
                                                desc.preference, 1, &heuristic, &found));
    if (found == 0) {
      return absl::UnimplementedError(absl::StrFormat(
          "cuBLASLt has no algorithm for a %dx%dx%d product with epilogue %d (pointer "
          "alignments %d, %d, %d bytes)%s",
          m, n, k, static_cast<int>(epilogue), key.align_a, key.align_b, key.align_d,
          epilogue == CUBLASLT_EPILOGUE_DEFAULT || epilogue == CUBLASLT_EPILOGUE_BIAS
              ? ""
              : "; runtime.fuse_gelu = \"off\" runs the GELU as its own kernel"));
    }
    algo = heuristic.algo;
    if (ctx.algorithms != nullptr) ctx.algorithms->algorithms.emplace(key, algo);
  }
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  CUBLAS_CHECK(cublasLtMatmul(ctx.lt, desc.op, &alpha, A, desc.a, B, desc.b, &beta, D, desc.d, D,
                              desc.d, &algo, ctx.workspace, ctx.workspace_bytes,
                              ctx.stream));
  return absl::OkStatus();
}

}  // namespace

template <typename T>
absl::Status MatmulForward(const BlasContext& ctx, T* out, const T* inp, const T* weight,
                           const T* bias, int64_t N, int64_t C, int64_t OC, GeluFusion gelu,
                           T* pre_gelu) {
  cublasLtEpilogue_t epilogue = bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  if (gelu == GeluFusion::kForward) {
    epilogue = bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  }
  return LtMatmul(ctx, LinearForward(N, C, OC), weight, DataType<T>(), inp, DataType<T>(), out,
                  DataType<T>(), false, epilogue, bias,
                  gelu == GeluFusion::kForward ? pre_gelu : nullptr, OC);
}

template <typename T>
absl::Status MatmulBackwardInput(const BlasContext& ctx, T* dinp, const T* dout, const T* weight,
                                 int64_t N, int64_t C, int64_t OC, GeluFusion gelu,
                                 const T* pre_gelu) {
  const bool dgelu = gelu == GeluFusion::kBackward;
  // The GELU's input has dinp's shape: its leading dimension is dinp's, C.
  return LtMatmul(ctx, LinearBackwardInput(N, C, OC), weight, DataType<T>(), dout, DataType<T>(),
                  dinp, DataType<T>(), false,
                  dgelu ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT, nullptr,
                  dgelu ? const_cast<T*>(pre_gelu) : nullptr, C);
}

template <typename T>
absl::Status MatmulBackwardWeight(const BlasContext& ctx, float* dweight, const T* dout,
                                  const T* inp, int64_t N, int64_t C, int64_t OC, bool accumulate) {
  return LtMatmul(ctx, LinearBackwardWeight(N, C, OC), inp, DataType<T>(), dout, DataType<T>(),
                  dweight, CUDA_R_32F, accumulate, CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0);
}

template <typename T>
absl::Status BatchedGemm(const BlasContext& ctx, bool trans_a, bool trans_b, int64_t M,
                         int64_t N, int64_t K, float alpha, const T* A, int64_t lda,
                         int64_t stride_a, const T* B, int64_t ldb, int64_t stride_b, float beta,
                         T* C, int64_t ldc, int64_t stride_c, int64_t batch) {
  const ColumnMajorGemm g = RowMajor(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  // The handle's stream was set once where it was made (setting it here would also drop the
  // fixed workspace for cuBLAS's own, allocating pool).
  cudaStream_t stream = nullptr;
  CUBLAS_CHECK(cublasGetStream(ctx.blas, &stream));
  if (stream != ctx.stream) {
    return absl::InternalError(
        "BatchedGemm: the cuBLAS handle runs on another stream than its context's (set the "
        "handle's stream once, before its workspace)");
  }
  // The call's A is the caller's B (RowMajor swaps the operands).
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      ctx.blas, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.m,
      g.n, g.k, &alpha, B, DataType<T>(), g.lda, stride_b, A, DataType<T>(), g.ldb, stride_a,
      &beta, C, DataType<T>(), g.ldd, stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

#define FR_INSTANTIATE(T)                                                                         \
  template absl::Status MatmulForward<T>(const BlasContext&, T*, const T*, const T*, const T*,    \
                                         int64_t, int64_t, int64_t, GeluFusion, T*);              \
  template absl::Status MatmulBackwardInput<T>(const BlasContext&, T*, const T*, const T*,        \
                                               int64_t, int64_t, int64_t, GeluFusion, const T*);  \
  template absl::Status MatmulBackwardWeight<T>(const BlasContext&, float*, const T*, const T*,   \
                                                int64_t, int64_t, int64_t, bool);                 \
  template absl::Status BatchedGemm<T>(const BlasContext&, bool, bool, int64_t, int64_t, int64_t, \
                                       float, const T*, int64_t, int64_t, const T*, int64_t,      \
                                       int64_t, float, T*, int64_t, int64_t, int64_t);
FR_INSTANTIATE(float)
FR_INSTANTIATE(bf16)
#undef FR_INSTANTIATE

}  // namespace freeride::cuda
