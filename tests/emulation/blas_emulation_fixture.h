// The fixture of blas_emulation_test.cc: device buffers, the float64 reference, and one
// cuBLASLt product made as models/cuda/matmul.cc makes it.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

// Test-only helpers, one translation unit includes them.
namespace blas_emulation_test {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float Stored(float v, cudaDataType_t type) {
  return type == CUDA_R_16BF ? static_cast<float>(__nv_bfloat16(v)) : v;
}

std::vector<float> Random(size_t n, uint32_t seed, float range = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-range, range);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A device buffer of fp32 or bf16 elements; `host` mirrors what was written to it.
class DeviceBuffer {
 public:
  DeviceBuffer(cudaDataType_t type, std::vector<float> values) : type_(type), host_(values) {
    for (float& v : host_) v = Stored(v, type_);
    EXPECT_EQ(cudaMalloc(&ptr_, Bytes()), cudaSuccess);
    Write(host_);
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  const std::vector<float>& host() const { return host_; }
  std::vector<float> Read() const {
    std::vector<float> out(host_.size());
    if (type_ == CUDA_R_32F) {
      cudaMemcpy(out.data(), ptr_, Bytes(), cudaMemcpyDeviceToHost);
    } else {
      std::vector<__nv_bfloat16> raw(host_.size());
      cudaMemcpy(raw.data(), ptr_, Bytes(), cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < raw.size(); ++i) out[i] = static_cast<float>(raw[i]);
    }
    return out;
  }

 private:
  size_t Bytes() const { return host_.size() * (type_ == CUDA_R_32F ? 4 : 2); }
  void Write(const std::vector<float>& values) {
    if (type_ == CUDA_R_32F) {
      cudaMemcpy(ptr_, values.data(), Bytes(), cudaMemcpyHostToDevice);
    } else {
      std::vector<__nv_bfloat16> raw(values.begin(), values.end());
      cudaMemcpy(ptr_, raw.data(), Bytes(), cudaMemcpyHostToDevice);
    }
  }
  cudaDataType_t type_;
  std::vector<float> host_;
  void* ptr_ = nullptr;
};

double Gelu(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}
double GeluGrad(double x) {
  const double s = std::sqrt(2 / std::numbers::pi), th = std::tanh(s * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + th) + 0.5 * x * (1 - th * th) * s * (1 + 3 * 0.044715 * x * x);
}

// op(A) · op(B) (m × n, column-major) in float64, and Σ|a·b| per element for the tolerance.
struct Reference {
  std::vector<double> value, scale;
};
Reference Product(const std::vector<float>& a, int64_t lda, bool ta, const std::vector<float>& b,
                  int64_t ldb, bool tb, int64_t m, int64_t n, int64_t k) {
  Reference r{std::vector<double>(m * n), std::vector<double>(m * n)};
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      double sum = 0, scale = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double x = a[ta ? p + i * lda : i + p * lda], y = b[tb ? j + p * ldb : p + j * ldb];
        sum += x * y;
        scale += std::abs(x * y);
      }
      r.value[i + j * m] = sum;
      r.scale[i + j * m] = scale;
    }
  }
  return r;
}

// Within fp32 accumulation of `scale` and one rounding to `type`.
bool Near(double got, double want, double scale, cudaDataType_t type) {
  const double tol =
      (type == CUDA_R_16BF ? std::ldexp(std::abs(want), -8) : 0.0) + 2e-5 * scale + 1e-6;
  return std::abs(got - want) <= tol;
}

// Counts mismatches, reporting the first few (a large product would otherwise flood the log).
class Mismatches {
 public:
  void Check(double got, double want, double scale, cudaDataType_t type, const char* what,
             int64_t i, int64_t j) {
    if (Near(got, want, scale, type)) return;
    if (++count_ <= 5) {
      ADD_FAILURE() << what << " at (" << i << ", " << j << "): " << got << ", want " << want;
    }
  }
  ~Mismatches() { EXPECT_EQ(count_, 0) << "mismatched elements"; }

 private:
  int64_t count_ = 0;
};

// Everything one cuBLASLt product needs, as models/cuda/matmul.cc passes it.
struct LtArgs {
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldd = 0;
  cudaDataType_t ab = CUDA_R_32F, d = CUDA_R_32F;
  int a_type = -1;  // the A layout's type instead of `ab` when >= 0 (a mismatch on purpose)
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  void* aux = nullptr;
  int64_t aux_ld = 0;
  float alpha = 1.0f, beta = 0.0f;
  const void *A = nullptr, *B = nullptr;
  void* D = nullptr;
  const void* C = nullptr;  // D when null
  int64_t ldc = 0;          // ldd when 0
  int64_t a_rows = -1;      // the layout's own rows when >= 0 (a mismatch on purpose)
  uint32_t align = 256;
};
struct LtStatus {
  cublasStatus_t heuristic, matmul;
};

// Makes the descriptors, asks the heuristic, runs the product on `stream` and destroys the
// descriptors before the stream runs it. The matmul runs even when the heuristic refuses (with
// a null algo) so that both checks are seen.
LtStatus LtProduct(cublasLtHandle_t lt, const LtArgs& x, cudaStream_t stream) {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  EXPECT_EQ(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  const cublasOperation_t op_a = x.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = x.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &x.epilogue,
                                           sizeof(x.epilogue)),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &x.bias,
                                           sizeof(x.bias)),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &x.aux,
                                           sizeof(x.aux)),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &x.aux_ld,
                                           sizeof(x.aux_ld)),
            CUBLAS_STATUS_SUCCESS);
  const int64_t a_rows = x.a_rows >= 0 ? x.a_rows : (x.ta ? x.k : x.m);
  const int64_t ldc = x.ldc > 0 ? x.ldc : x.ldd;
  EXPECT_EQ(
      cublasLtMatrixLayoutCreate(&a, x.a_type >= 0 ? static_cast<cudaDataType_t>(x.a_type) : x.ab,
                                 a_rows, x.ta ? x.m : x.k, x.lda),
      CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&b, x.ab, x.tb ? x.n : x.k, x.tb ? x.k : x.n, x.ldb),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&c, x.d, x.m, x.n, ldc), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&d, x.d, x.m, x.n, x.ldd), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  const size_t workspace = 0;
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &workspace, sizeof(workspace)),
            CUBLAS_STATUS_SUCCESS);
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, attr, &x.align, sizeof(x.align)),
              CUBLAS_STATUS_SUCCESS);
  }
  cublasLtMatmulHeuristicResult_t result;
  int found = -1;
  LtStatus status;
  status.heuristic = cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, d, pref, 1, &result, &found);
  EXPECT_EQ(found, status.heuristic == CUBLAS_STATUS_SUCCESS ? 1 : 0);
  const float alpha = x.alpha, beta = x.beta;  // gone before the stream runs the product
  status.matmul = cublasLtMatmul(lt, op, &alpha, x.A, a, x.B, b, &beta, x.C ? x.C : x.D, c, x.D, d,
                                 status.heuristic == CUBLAS_STATUS_SUCCESS ? &result.algo : nullptr,
                                 nullptr, 0, stream);
  cublasLtMatmulPreferenceDestroy(pref);
  for (cublasLtMatrixLayout_t layout : {a, b, c, d}) cublasLtMatrixLayoutDestroy(layout);
  cublasLtMatmulDescDestroy(op);
  return status;
}

class BlasEmulationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cublasLtCreate(&lt_), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasCreate(&blas_), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    ASSERT_EQ(cublasSetStream(blas_, stream_), CUBLAS_STATUS_SUCCESS);
  }
  void TearDown() override {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
    cublasDestroy(blas_);
    cublasLtDestroy(lt_);
  }
  void Sync() { ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess); }

  // One cuBLASLt product of m × n × k against the reference; `separate_c` reads C from its own
  // buffer (another leading dimension) instead of D.
  void CheckLt(cudaDataType_t ab, cudaDataType_t d_type, bool ta, bool tb,
               cublasLtEpilogue_t epilogue, float beta, int64_t m, int64_t n, int64_t k,
               bool separate_c = false, std::vector<float>* first = nullptr);

  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

void BlasEmulationTest::CheckLt(cudaDataType_t ab, cudaDataType_t d_type, bool ta, bool tb,
                                cublasLtEpilogue_t epilogue, float beta, int64_t m, int64_t n,
                                int64_t k, bool separate_c, std::vector<float>* first) {
  const bool bias_on =
      epilogue == CUBLASLT_EPILOGUE_BIAS || epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool gelu_aux =
      epilogue == CUBLASLT_EPILOGUE_GELU_AUX || epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool dgelu = epilogue == CUBLASLT_EPILOGUE_DGELU;
  LtArgs x;
  x.ta = ta;
  x.tb = tb;
  x.m = m;
  x.n = n;
  x.k = k;
  x.lda = std::max<int64_t>(1, (ta ? k : m) + 2);
  x.ldb = std::max<int64_t>(1, (tb ? n : k) + 1);
  x.ldd = m + 3;
  x.ab = ab;
  x.d = d_type;
  x.epilogue = epilogue;
  x.beta = beta;
  x.alpha = beta != 0.0f ? 0.75f : 1.0f;
  x.aux_ld = (m + 7) / 8 * 8 + 8;
  // At least one element each: k = 0 leaves A or B empty, and cudaMalloc(0) may give null.
  DeviceBuffer A(ab, Random(std::max<int64_t>(1, x.lda * (ta ? m : k)), 1, 1.0f));
  DeviceBuffer B(ab, Random(std::max<int64_t>(1, x.ldb * (tb ? k : n)), 2, 1.0f));
  // D starts as C's values (beta = 1) or as NaN, which beta = 0 must never read.
  std::vector<float> d0 = Random(x.ldd * n, 3, 1.0f);
  if (beta == 0.0f && !separate_c) d0.assign(d0.size(), kNaN);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = m; i < x.ldd; ++i) d0[i + j * x.ldd] = 7.0f;  // padding to leave alone
  }
  DeviceBuffer D(d_type, d0);
  const int64_t ldc = separate_c ? m + 1 : x.ldd;
  DeviceBuffer C(d_type, Random(ldc * n, 4, 1.0f));
  DeviceBuffer bias(d_type, Random(m, 5, 0.5f));
  DeviceBuffer aux(d_type,
                   dgelu ? Random(x.aux_ld * n, 6, 3.0f) : std::vector<float>(x.aux_ld * n, kNaN));
  x.A = A.get();
  x.B = B.get();
  x.D = D.get();
  if (separate_c) {
    x.C = C.get();
    x.ldc = ldc;
  }
  if (bias_on) x.bias = bias.get();
  if (gelu_aux || dgelu) x.aux = aux.get();
  const LtStatus status = LtProduct(lt_, x, stream_);
  ASSERT_EQ(status.heuristic, CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(status.matmul, CUBLAS_STATUS_SUCCESS);
  Sync();
  const Reference ref = Product(A.host(), x.lda, ta, B.host(), x.ldb, tb, m, n, k);
  const std::vector<float> got = D.Read(), got_aux = aux.Read();
  const std::vector<float>& c = separate_c ? C.host() : D.host();
  Mismatches mismatches;
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      double v = x.alpha * ref.value[i + j * m];
      double scale = x.alpha * ref.scale[i + j * m];
      const double from_c = beta != 0.0f ? beta * c[i + j * ldc] : 0.0;
      const double from_bias = bias_on ? bias.host()[i] : 0.0;
      v += from_c + from_bias;
      scale += std::abs(from_c) + std::abs(from_bias);
      double want = v;
      if (gelu_aux) {
        mismatches.Check(got_aux[i + j * x.aux_ld], v, scale, d_type, "aux", i, j);
        want = Gelu(v);
      } else if (dgelu) {
        const double g = GeluGrad(aux.host()[i + j * x.aux_ld]);
        want = v * g;
        scale *= std::abs(g);
      }
      mismatches.Check(got[i + j * x.ldd], want, scale, d_type, "D", i, j);
    }
    for (int64_t i = m; i < x.ldd; ++i) ASSERT_EQ(got[i + j * x.ldd], 7.0f) << "padding";
  }
  if (first != nullptr) *first = got;
}

}  // namespace blas_emulation_test
