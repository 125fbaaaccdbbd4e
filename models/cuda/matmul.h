// Matrix products on the GPU. Linear layers go through cuBLASLt, with the bias and GELU folded
// into the product's epilogue where cuBLASLt can; attention's batched products through
// cuBLAS's strided-batched GEMM. Shapes and conventions follow models/cpu/kernels.h: row-major,
// a weight is [OC, C], out = inp · Wᵀ + b. Products accumulate in fp32 whatever the element
// type; weight gradients are fp32.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "models/cuda/kernels.h"

namespace freeride::cuda {

// Handles and the fixed workspace every product of a model chunk uses (a fixed workspace keeps
// cuBLASLt's choice of algorithm, and so the bits, the same from call to call).
// `algorithms` (optional) remembers cuBLASLt's heuristic answer per product shape, so each
// shape is asked about once rather than at every call.
struct LtAlgorithmCache;
struct BlasContext {
  cublasLtHandle_t lt = nullptr;
  cublasHandle_t blas = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
  LtAlgorithmCache* algorithms = nullptr;
};

// Owns the cache a BlasContext points at.
std::shared_ptr<LtAlgorithmCache> MakeLtAlgorithmCache();

enum class GeluFusion { kNone, kForward, kBackward };

// out [N, OC] = inp [N, C] · weightᵀ (+ bias). With GeluFusion::kForward, `out` gets
// GELU(inp · wᵀ + b) and `pre_gelu` the value before it.
template <typename T>
absl::Status MatmulForward(const BlasContext& ctx, T* out, const T* inp, const T* weight,
                           const T* bias, int64_t N, int64_t C, int64_t OC,
                           GeluFusion gelu = GeluFusion::kNone, T* pre_gelu = nullptr);
// dinp [N, C] = dout [N, OC] · weight. With GeluFusion::kBackward, the result is multiplied by
// GELU'(pre_gelu) (the gradient through a GELU that fed this layer).
template <typename T>
absl::Status MatmulBackwardInput(const BlasContext& ctx, T* dinp, const T* dout, const T* weight,
                                 int64_t N, int64_t C, int64_t OC,
                                 GeluFusion gelu = GeluFusion::kNone,
                                 const T* pre_gelu = nullptr);
// dweight [OC, C] += doutᵀ · inp (fp32); without `accumulate`, dweight = doutᵀ · inp (beta = 0:
// the first micro-batch of a step writes over gradients ZeroGrads left unzeroed).
template <typename T>
absl::Status MatmulBackwardWeight(const BlasContext& ctx, float* dweight, const T* dout,
                                  const T* inp, int64_t N, int64_t C, int64_t OC,
                                  bool accumulate = true);

// C[b] = alpha · op(A[b]) · op(B[b]) + beta · C[b] for `batch` row-major matrices, M×N result,
// K the inner dimension; strides in elements.
template <typename T>
absl::Status BatchedGemm(const BlasContext& ctx, bool trans_a, bool trans_b, int64_t M,
                         int64_t N, int64_t K, float alpha, const T* A, int64_t lda,
                         int64_t stride_a, const T* B, int64_t ldb, int64_t stride_b, float beta,
                         T* C, int64_t ldc, int64_t stride_c, int64_t batch);

}  // namespace freeride::cuda
