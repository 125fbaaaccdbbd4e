// The emulated cuBLAS and cuBLASLt (models/cuda/emulation/blas.cc) against a float64 reference:
// both transposes, fp32 and bf16, every epilogue the linear layers use, beta 0 and 1, the
// strided batched GEMM, and the errors the real libraries give for bad arguments. Products run
// on a stream and are read back after it synchronises, as on a GPU.
#include "tests/emulation/blas_emulation_fixture.h"

namespace blas_emulation_test {
namespace {

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
}  // namespace blas_emulation_test

