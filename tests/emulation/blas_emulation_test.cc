// The emulated cuBLAS and cuBLASLt (models/cuda/emulation/blas.cc) against a float64 reference:
// both transposes, fp32 and bf16, every epilogue the linear layers use, beta 0 and 1, the
// strided batched GEMM, and the errors the real libraries give for bad arguments. Products run
// on a stream and are read back after it synchronises, as on a GPU.
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

namespace {

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

TEST_F(BlasEmulationTest, LtMatchesFloat64ForEveryTypeTransposeEpilogueAndBeta) {
  const std::pair<cudaDataType_t, cudaDataType_t> types[] = {
      {CUDA_R_32F, CUDA_R_32F}, {CUDA_R_16BF, CUDA_R_16BF}, {CUDA_R_16BF, CUDA_R_32F}};
  for (auto [ab, d] : types) {
    for (int t = 0; t < 4; ++t) {
      for (cublasLtEpilogue_t e :
           {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_GELU_AUX,
            CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLASLT_EPILOGUE_DGELU}) {
        for (float beta : {0.0f, 1.0f}) {
          SCOPED_TRACE("types " + std::to_string(ab) + "/" + std::to_string(d) + " trans " +
                       std::to_string(t) + " epilogue " + std::to_string(e) + " beta " +
                       std::to_string(beta));
          CheckLt(ab, d, t & 1, t & 2, e, beta, 13, 9, 11);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST_F(BlasEmulationTest, LtReadsASeparateC) {
  CheckLt(CUDA_R_32F, CUDA_R_32F, false, true, CUBLASLT_EPILOGUE_DEFAULT, 1.0f, 6, 5, 4, true);
  CheckLt(CUDA_R_16BF, CUDA_R_16BF, true, false, CUBLASLT_EPILOGUE_BIAS, 1.0f, 6, 5, 4, true);
}

TEST_F(BlasEmulationTest, LtWithNoInnerDimensionIsBetaCPlusBias) {
  CheckLt(CUDA_R_16BF, CUDA_R_16BF, false, false, CUBLASLT_EPILOGUE_BIAS, 1.0f, 5, 4, 0);
  CheckLt(CUDA_R_32F, CUDA_R_32F, true, false, CUBLASLT_EPILOGUE_DEFAULT, 0.0f, 5, 4, 0);
}

// A head-sized output is made in column chunks (op(B)'s columns are B's rows when transposed);
// the bits must not depend on anything but the inputs.
TEST_F(BlasEmulationTest, LargeLtProductIsRightAndDeterministic) {
  CheckLt(CUDA_R_16BF, CUDA_R_16BF, true, false, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, 0.0f, 1024, 4500,
          8);
  std::vector<float> first, second;
  CheckLt(CUDA_R_16BF, CUDA_R_32F, false, true, CUBLASLT_EPILOGUE_DEFAULT, 1.0f, 1024, 4500, 8,
          false, &first);
  CheckLt(CUDA_R_16BF, CUDA_R_32F, false, true, CUBLASLT_EPILOGUE_DEFAULT, 1.0f, 1024, 4500, 8,
          false, &second);
  EXPECT_TRUE(first == second);
}

TEST_F(BlasEmulationTest, StridedBatchedMatchesFloat64) {
  const int m = 7, n = 5, k = 6, batch = 3;
  const std::pair<cudaDataType_t, cudaDataType_t> types[] = {
      {CUDA_R_32F, CUDA_R_32F}, {CUDA_R_16BF, CUDA_R_16BF}, {CUDA_R_16BF, CUDA_R_32F}};
  for (auto [ab, c_type] : types) {
    for (int t = 0; t < 4; ++t) {
      for (float beta : {0.0f, 1.0f}) {
        SCOPED_TRACE("types " + std::to_string(ab) + "/" + std::to_string(c_type) + " trans " +
                     std::to_string(t) + " beta " + std::to_string(beta));
        const bool ta = t & 1, tb = t & 2;
        const int lda = (ta ? k : m) + 1, ldb = (tb ? n : k) + 2, ldc = m + 1;
        const long long sa = lda * (ta ? m : k) + 3, sb = ldb * (tb ? k : n) + 1, sc = ldc * n + 2;
        DeviceBuffer A(ab, Random(sa * batch, 10 + t));
        DeviceBuffer B(ab, Random(sb * batch, 20 + t));
        std::vector<float> c0 = Random(sc * batch, 30 + t);
        if (beta == 0.0f) c0.assign(c0.size(), kNaN);
        DeviceBuffer C(c_type, c0);
        const float alpha = 0.5f;
        ASSERT_EQ(cublasGemmStridedBatchedEx(
                      blas_, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n,
                      k, &alpha, A.get(), ab, lda, sa, B.get(), ab, ldb, sb, &beta, C.get(), c_type,
                      ldc, sc, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                  CUBLAS_STATUS_SUCCESS);
        Sync();
        const std::vector<float> got = C.Read();
        Mismatches mismatches;
        for (int p = 0; p < batch; ++p) {
          const std::vector<float> a(A.host().begin() + p * sa, A.host().begin() + (p + 1) * sa);
          const std::vector<float> b(B.host().begin() + p * sb, B.host().begin() + (p + 1) * sb);
          const Reference ref = Product(a, lda, ta, b, ldb, tb, m, n, k);
          for (int j = 0; j < n; ++j) {
            for (int i = 0; i < m; ++i) {
              const int64_t at = p * sc + i + j * ldc;
              const double c = beta != 0.0f ? beta * C.host()[at] : 0.0;
              mismatches.Check(got[at], alpha * ref.value[i + j * m] + c,
                               alpha * ref.scale[i + j * m] + std::abs(c), c_type, "C", i,
                               p * n + j);
            }
          }
        }
      }
    }
  }
}

TEST_F(BlasEmulationTest, LtRefusesShapesThatDoNotAgree) {
  DeviceBuffer A(CUDA_R_32F, Random(64, 1)), B(CUDA_R_32F, Random(64, 2)),
      D(CUDA_R_32F, Random(64, 3));
  LtArgs x;
  x.m = 4, x.n = 3, x.k = 2, x.lda = 4, x.ldb = 2, x.ldd = 4;
  x.A = A.get(), x.B = B.get(), x.D = D.get();
  const auto expect = [&](const LtArgs& args, cublasStatus_t heuristic, cublasStatus_t matmul,
                          const char* what) {
    const LtStatus s = LtProduct(lt_, args, stream_);
    EXPECT_EQ(s.heuristic, heuristic) << what;
    EXPECT_EQ(s.matmul, matmul) << what;
  };
  constexpr cublasStatus_t kOk = CUBLAS_STATUS_SUCCESS, kInvalid = CUBLAS_STATUS_INVALID_VALUE,
                           kUnsupported = CUBLAS_STATUS_NOT_SUPPORTED;
  expect(x, kOk, kOk, "the well-formed product");
  LtArgs bad = x;
  bad.a_rows = 5, bad.lda = 5;
  expect(bad, kInvalid, kInvalid, "op(A) rows != D rows");
  bad = x, bad.ta = true, bad.a_rows = 2, bad.lda = 2;  // A is 2 × 4: op(A) 4 × 2, fine
  expect(bad, kOk, kOk, "transposed A");
  bad = x, bad.ldb = 1;
  expect(bad, kInvalid, kInvalid, "ldb < B's rows");
  bad = x, bad.ldd = 3;
  expect(bad, kInvalid, kInvalid, "ldd < D's rows");
  bad = x, bad.tb = true, bad.ldb = 3;  // B laid out 3 × 2 transposed: op(B) 2 × 3 agrees
  expect(bad, kOk, kOk, "transposed B");
  bad = x, bad.tb = true;  // ldb 2 < B's 3 rows
  expect(bad, kInvalid, kInvalid, "transposed B with ldb < rows");
  bad = x, bad.a_type = CUDA_R_16BF;
  expect(bad, kUnsupported, kUnsupported, "fp32 B with a bf16 A");
  bad = x, bad.ab = CUDA_R_16F, bad.d = CUDA_R_16F;
  expect(bad, kUnsupported, kUnsupported, "fp16");
  bad = x, bad.ab = CUDA_R_32F, bad.d = CUDA_R_16BF;
  expect(bad, kUnsupported, kUnsupported, "fp32 into bf16");
  bad = x, bad.epilogue = CUBLASLT_EPILOGUE_RELU;
  expect(bad, kUnsupported, kUnsupported, "a ReLU epilogue");
  bad = x, bad.align = 2;
  expect(bad, kUnsupported, kOk, "fp32 pointers aligned to 2 bytes only");
  DeviceBuffer aux(CUDA_R_32F, Random(64, 4));
  bad = x, bad.epilogue = CUBLASLT_EPILOGUE_GELU_AUX, bad.aux = aux.get(), bad.aux_ld = 8;
  expect(bad, kOk, kOk, "GELU_AUX with aux_ld 8");
  bad.aux_ld = 2;
  expect(bad, kInvalid, kInvalid, "aux_ld < D's rows");
  bad.aux_ld = 12;
  expect(bad, kUnsupported, kUnsupported, "aux_ld not a multiple of 8");
  bad.aux_ld = 8, bad.aux = nullptr;
  expect(bad, kOk, kInvalid, "GELU_AUX without its matrix");
  bad = x, bad.epilogue = CUBLASLT_EPILOGUE_BIAS;
  expect(bad, kOk, kInvalid, "BIAS without a bias");
  std::vector<float> host(64);
  bad = x, bad.A = host.data();
  expect(bad, kOk, kInvalid, "A in host memory");
  bad = x, bad.D = static_cast<char*>(D.get()) + 2;
  expect(bad, kOk, kInvalid, "D not aligned to its elements");
  bad = x, bad.D = static_cast<char*>(D.get()) + 4 * 60;
  expect(bad, kOk, kInvalid, "D running past its allocation");
  bad = x, bad.C = D.get(), bad.ldc = 5;
  expect(bad, kOk, kInvalid, "C in place of D with another leading dimension");
  Sync();
}

TEST_F(BlasEmulationTest, LtChecksAttributesAndHandles) {
  cublasLtMatmulDesc_t op = nullptr;
  ASSERT_EQ(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  const cublasOperation_t t = CUBLAS_OP_T;
  const int64_t wide = CUBLAS_OP_T, ld = 8;
  const int32_t narrow_ld = 8, bad_op = 7;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof(wide)),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &bad_op, 4),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, 8),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &narrow_ld,
                                           sizeof(narrow_ld)),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, nullptr, 8),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, static_cast<cublasLtMatmulDescAttributes_t>(9), &t,
                                           sizeof(t)),
            CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatmulPreference_t pref = nullptr;
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  const uint32_t small = 64;
  const uint64_t big = 64;
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &small, sizeof(small)),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                 &big, sizeof(big)),
            CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatrixLayout_t layout = nullptr;
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&layout, CUDA_R_32F, 4, 4, -1), CUBLAS_STATUS_INVALID_VALUE);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&layout, CUDA_R_32F, 4, 4, 4), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t result;
  int found = -1;
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(nullptr, op, layout, layout, layout, layout, pref, 1,
                                           &result, &found),
            CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(found, 0);
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(lt_, op, layout, layout, layout, layout, pref, 0,
                                           &result, &found),
            CUBLAS_STATUS_INVALID_VALUE);
  ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(lt_, op, layout, layout, layout, layout, pref, 1,
                                           &result, &found),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(found, 1);
  EXPECT_EQ(result.state, CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(result.workspaceSize, 0u);
  EXPECT_GT(result.wavesCount, 0.0f);
  std::map<int, cublasLtMatmulAlgo_t> cache;  // as matmul.cc keeps them
  cache.emplace(1, result.algo);
  DeviceBuffer a(CUDA_R_32F, Random(16, 1)), d(CUDA_R_32F, Random(16, 2));
  const float one = 1.0f, zero = 0.0f;
  EXPECT_EQ(cublasLtMatmul(lt_, op, &one, a.get(), layout, a.get(), layout, &zero, d.get(), layout,
                           d.get(), layout, &cache.at(1), nullptr, 0, stream_),
            CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulAlgo_t garbage{};
  EXPECT_EQ(cublasLtMatmul(lt_, op, &one, a.get(), layout, a.get(), layout, &zero, d.get(), layout,
                           d.get(), layout, &garbage, nullptr, 0, stream_),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmul(nullptr, op, &one, a.get(), layout, a.get(), layout, &zero, d.get(),
                           layout, d.get(), layout, nullptr, nullptr, 0, stream_),
            CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(cublasLtMatmul(lt_, op, nullptr, a.get(), layout, a.get(), layout, &zero, d.get(),
                           layout, d.get(), layout, nullptr, nullptr, 0, stream_),
            CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatmulDesc_t tf32 = nullptr;
  ASSERT_EQ(cublasLtMatmulDescCreate(&tf32, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(lt_, tf32, layout, layout, layout, layout, pref, 1,
                                           &result, &found),
            CUBLAS_STATUS_NOT_SUPPORTED);
  Sync();
  // a · a (a read as 4 × 4, transposed) against the reference.
  const Reference ref = Product(a.host(), 4, true, a.host(), 4, false, 4, 4, 4);
  const std::vector<float> got = d.Read();
  Mismatches mismatches;
  for (int i = 0; i < 16; ++i) {
    mismatches.Check(got[i], ref.value[i], ref.scale[i], CUDA_R_32F, "a'a", i % 4, i / 4);
  }
  cublasLtMatmulDescDestroy(tf32);
  cublasLtMatrixLayoutDestroy(layout);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatmulDescDestroy(op);
}

TEST_F(BlasEmulationTest, StridedBatchedRefusesBadArguments) {
  DeviceBuffer a(CUDA_R_32F, Random(64, 1)), c(CUDA_R_32F, Random(64, 2));
  std::vector<float> host(64);
  const float one = 1.0f, zero = 0.0f;
  const auto gemm = [&](int m, int lda, int batch, const void* C, cudaDataType_t c_type,
                        cublasComputeType_t compute, cublasOperation_t op = CUBLAS_OP_N) {
    return cublasGemmStridedBatchedEx(
        blas_, op, CUBLAS_OP_N, m, 2, 2, &one, a.get(), CUDA_R_32F, lda, 8, a.get(), CUDA_R_32F, 2,
        8, &zero, const_cast<void*>(C), c_type, 4, 16, batch, compute, CUBLAS_GEMM_DEFAULT);
  };
  EXPECT_EQ(gemm(4, 4, 2, c.get(), CUDA_R_32F, CUBLAS_COMPUTE_32F), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(gemm(4, 3, 2, c.get(), CUDA_R_32F, CUBLAS_COMPUTE_32F), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(4, 4, -1, c.get(), CUDA_R_32F, CUBLAS_COMPUTE_32F), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(
      gemm(4, 4, 2, c.get(), CUDA_R_32F, CUBLAS_COMPUTE_32F, static_cast<cublasOperation_t>(5)),
      CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(4, 4, 2, c.get(), CUDA_R_32F, CUBLAS_COMPUTE_16F), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(gemm(4, 4, 2, c.get(), CUDA_R_16BF, CUBLAS_COMPUTE_32F), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(gemm(4, 4, 2, host.data(), CUDA_R_32F, CUBLAS_COMPUTE_32F),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(4, 4, 5, c.get(), CUDA_R_32F, CUBLAS_COMPUTE_32F), CUBLAS_STATUS_INVALID_VALUE)
      << "the fifth C lies past the allocation";
  EXPECT_EQ(gemm(0, 4, 2, c.get(), CUDA_R_32F, CUBLAS_COMPUTE_32F), CUBLAS_STATUS_SUCCESS);
  Sync();
}

TEST_F(BlasEmulationTest, HandleStreamWorkspaceAndNames) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cublasGetStream(blas_, &stream), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(stream, stream_);
  void* workspace = nullptr;
  ASSERT_EQ(cudaMalloc(&workspace, 1024), cudaSuccess);
  EXPECT_EQ(cublasSetWorkspace(blas_, workspace, 1024), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasSetWorkspace(blas_, static_cast<char*>(workspace) + 16, 512),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasSetWorkspace(nullptr, workspace, 1024), CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(cublasSetStream(nullptr, stream_), CUBLAS_STATUS_NOT_INITIALIZED);
  cudaFree(workspace);
  EXPECT_STREQ(cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
  EXPECT_STREQ(cublasGetStatusName(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE");
  EXPECT_NE(std::string(cublasGetStatusString(CUBLAS_STATUS_ALLOC_FAILED)), "");
  EXPECT_GE(cublasLtGetVersion(), 130000u);
  EXPECT_EQ(CUBLAS_STATUS_INVALID_VALUE, 7);
  EXPECT_EQ(CUBLASLT_EPILOGUE_GELU_AUX_BIAS, 164);
  EXPECT_EQ(CUBLASLT_EPILOGUE_DGELU, 192);
  EXPECT_EQ(CUBLAS_COMPUTE_32F, 68);
  EXPECT_EQ(CUDA_R_16BF, 14);
}

}  // namespace
