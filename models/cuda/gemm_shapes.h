// How each row-major matrix product of the model becomes a column-major BLAS call (cuBLAS and
// cuBLASLt are column-major). Plain C++ so that the tests check every mapping on the CPU,
// against a column-major reference product, where no GPU is needed.
#pragma once

#include <cstdint>

namespace freeride::cuda {

// D (m × n, column-major, leading dimension ldd) = op(A) · op(B): A is m × k after op (stored
// k × m when transposed), B is k × n after op.
struct ColumnMajorGemm {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldd = 0;
};

// A linear layer, out [N, OC] = inp [N, C] · weightᵀ: row-major out is column-major outᵀ
// (OC × N) = weight (read as C × OC, transposed) · inp (read as C × N). A = weight, B = inp.
inline ColumnMajorGemm LinearForward(int64_t N, int64_t C, int64_t OC) {
  return {true, false, OC, N, C, C, C, OC};
}
// dinp [N, C] = dout [N, OC] · weight: dinpᵀ (C × N) = weight (C × OC) · doutᵀ (OC × N).
// A = weight, B = dout.
inline ColumnMajorGemm LinearBackwardInput(int64_t N, int64_t C, int64_t OC) {
  return {false, false, C, N, OC, C, OC, C};
}
// dweight [OC, C] += doutᵀ · inp: dweight read as C × OC = inp (C × N) · dout (OC × N)ᵀ.
// A = inp, B = dout.
inline ColumnMajorGemm LinearBackwardWeight(int64_t N, int64_t C, int64_t OC) {
  return {false, true, C, OC, N, C, OC, C};
}
// Row-major C (M × N) = op(A) · op(B) is column-major Cᵀ = op(B)ᵀ · op(A)ᵀ: the same flags,
// M and N swapped, and the operands swapped (the call's A is the caller's B).
inline ColumnMajorGemm RowMajor(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                int64_t lda, int64_t ldb, int64_t ldc) {
  return {trans_b, trans_a, N, M, K, ldb, lda, ldc};
}

}  // namespace freeride::cuda
