#include "models/cuda/emulation/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "models/cuda/emulation/include/cuda_bf16.h"

namespace freeride::emu {
namespace {

// The fp32 product is made this many elements of D at a time, bounding the scratch memory for
// a bf16 head (vocabulary × tokens) to 16 MiB.
constexpr int64_t kChunkElements = int64_t{1} << 22;

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/π)

// The tanh GELU and its derivative, as the project's own GELU kernels compute them.
float Gelu(float x) {
  return 0.5f * x * (1.0f + std::tanh(kGeluScale * (x + 0.044715f * x * x * x)));
}
float GeluGrad(float x) {
  const float th = std::tanh(kGeluScale * (x + 0.044715f * x * x * x));
  return 0.5f * (1.0f + th) +
         0.5f * x * (1.0f - th * th) * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
}

// A column-major matrix as sgemm takes it: fp32 where it lies, bf16 converted into `scratch`
// (contiguous, so *ld becomes rows).
const float* AsFloat(const void* p, cudaDataType_t type, int64_t rows, int64_t cols, int64_t* ld,
                     std::vector<float>* scratch) {
  if (type == CUDA_R_32F) return static_cast<const float*>(p);
  scratch->resize(rows * cols);
  for (int64_t j = 0; j < cols; ++j) {
    const __nv_bfloat16* from = static_cast<const __nv_bfloat16*>(p) + j * *ld;
    for (int64_t i = 0; i < rows; ++i) (*scratch)[i + j * rows] = static_cast<float>(from[i]);
  }
  *ld = rows;
  return scratch->data();
}

// D's columns [j0, j0 + cols) from the fp32 products `p` (m × cols, alpha applied): beta · C,
// the epilogue, then the one rounding to T.
template <typename T>
void Finish(const Gemm& g, const float* p, int64_t j0, int64_t cols) {
  const T* c = static_cast<const T*>(g.c);
  T* d = static_cast<T*>(g.d);
  const T* bias = HasBias(g.epilogue) ? static_cast<const T*>(g.bias) : nullptr;
  T* aux = static_cast<T*>(g.aux);
  for (int64_t j = j0; j < j0 + cols; ++j) {
    const float* pj = p + (j - j0) * g.m;
    for (int64_t i = 0; i < g.m; ++i) {
      float v = pj[i];
      // beta = 0 never reads C: it may hold anything, NaN included.
      if (g.beta != 0.0f) v += g.beta * static_cast<float>(c[i + j * g.ldc]);
      if (bias != nullptr) v += static_cast<float>(bias[i]);
      switch (g.epilogue) {
        case CUBLASLT_EPILOGUE_GELU_AUX:
        case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
          aux[i + j * g.aux_ld] = static_cast<T>(v);
          v = Gelu(v);
          break;
        case CUBLASLT_EPILOGUE_DGELU:
          v *= GeluGrad(static_cast<float>(aux[i + j * g.aux_ld]));
          break;
        default:
          break;
      }
      d[i + j * g.ldd] = static_cast<T>(v);
    }
  }
}

}  // namespace

size_t ElementSize(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

bool HasBias(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool HasAux(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
         e == CUBLASLT_EPILOGUE_DGELU;
}

void RunGemm(const Gemm& g, Scratch* s) {
  if (g.m == 0 || g.n == 0) return;
  const bool product = g.k > 0 && g.alpha != 0.0f;  // else A and B are not read
  const auto ta = g.a.trans ? CblasTrans : CblasNoTrans;
  const auto tb = g.b.trans ? CblasTrans : CblasNoTrans;
  if (product && g.a.type == CUDA_R_32F && g.out_type == CUDA_R_32F &&
      g.epilogue == CUBLASLT_EPILOGUE_DEFAULT &&
      (g.beta == 0.0f || (g.c == g.d && g.ldc == g.ldd))) {
    // sgemm straight into D: it writes over D when beta = 0 without reading it.
    cblas_sgemm(CblasColMajor, ta, tb, g.m, g.n, g.k, g.alpha, static_cast<const float*>(g.a.p),
                g.a.ld, static_cast<const float*>(g.b.p), g.b.ld, g.beta, static_cast<float*>(g.d),
                g.ldd);
    return;
  }
  int64_t lda = g.a.ld;
  const float* a =
      product ? AsFloat(g.a.p, g.a.type, g.a.trans ? g.k : g.m, g.a.trans ? g.m : g.k, &lda, &s->a)
              : nullptr;
  const int64_t chunk = std::clamp<int64_t>(kChunkElements / g.m, 1, g.n);
  for (int64_t j0 = 0; j0 < g.n; j0 += chunk) {
    const int64_t cols = std::min(chunk, g.n - j0);
    s->p.resize(g.m * cols);
    if (product) {
      // op(B)'s columns [j0, j0 + cols): stored columns, or stored rows when transposed.
      const char* b0 =
          static_cast<const char*>(g.b.p) + (g.b.trans ? j0 : j0 * g.b.ld) * ElementSize(g.b.type);
      int64_t ldb = g.b.ld;
      const float* b =
          AsFloat(b0, g.b.type, g.b.trans ? cols : g.k, g.b.trans ? g.k : cols, &ldb, &s->b);
      cblas_sgemm(CblasColMajor, ta, tb, g.m, cols, g.k, g.alpha, a, lda, b, ldb, 0.0f, s->p.data(),
                  g.m);
    } else {
      std::fill(s->p.begin(), s->p.end(), 0.0f);
    }
    if (g.out_type == CUDA_R_32F) {
      Finish<float>(g, s->p.data(), j0, cols);
    } else {
      Finish<__nv_bfloat16>(g, s->p.data(), j0, cols);
    }
  }
}

}  // namespace freeride::emu
