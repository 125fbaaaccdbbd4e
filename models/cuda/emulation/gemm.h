// The arithmetic of the emulated cuBLAS(Lt) (blas.cc): one column-major product with its
// epilogue, by value, run in stream order. Operands become fp32 and OpenBLAS's sgemm multiplies
// them; beta · C, the bias, GELU (or its derivative) and the one rounding to the output type
// follow in fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "models/cuda/emulation/include/cublasLt.h"
#include "models/cuda/emulation/include/library_types.h"

namespace freeride::emu {

size_t ElementSize(cudaDataType_t t);
bool HasBias(uint32_t epilogue);
bool HasAux(uint32_t epilogue);

// One column-major product and its epilogue: everything the arithmetic reads, by value.
struct Operand {
  const void* p = nullptr;
  cudaDataType_t type = CUDA_R_32F;
  int64_t ld = 0;
  bool trans = false;
};
struct Gemm {
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f, beta = 0.0f;
  Operand a, b;                          // op(a) is m × k, op(b) is k × n
  cudaDataType_t out_type = CUDA_R_32F;  // C's and D's
  const void* c = nullptr;
  int64_t ldc = 0;
  void* d = nullptr;
  int64_t ldd = 0;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;  // m elements of out_type
  void* aux = nullptr;         // m × n of out_type, leading dimension aux_ld
  int64_t aux_ld = 0;
};

struct Scratch {
  std::vector<float> a, b, p;
};

// Runs one product. The order of every sum depends on the shapes alone, so the same inputs give
// the same bits (for one OpenBLAS build and thread count).
void RunGemm(const Gemm& g, Scratch* s);

}  // namespace freeride::emu
