// Makes OpenBLAS use the vector units this CPU has. OpenBLAS 0.3.21 (Debian 12) does not know
// newer Intel server cores (Sapphire Rapids) and falls back to its Haswell (AVX2) kernels,
// about half the matrix-product speed of its AVX-512 ones there (measured: 100 vs 215 GFLOP/s
// sgemm on 2 cores). OpenBLAS reads OPENBLAS_CORETYPE only when it is loaded, so the choice
// is made by re-executing the program once with the variable set.
#pragma once

namespace freeride {

// When OPENBLAS_CORETYPE is unset, OpenBLAS chose Haswell kernels and the CPU has AVX-512
// (F, BW, DQ, VL): sets OPENBLAS_CORETYPE (Cooperlake with AVX-512 BF16, else SkylakeX) and
// re-executes /proc/self/exe with the same arguments. Returns normally in every other case
// (including when the re-exec fails: the program then runs on the slower kernels).
void UseBestBlasKernels(char** argv);

// OpenBLAS's kernel family in use ("Haswell", "SkylakeX", ...).
const char* BlasCoreName();

}  // namespace freeride
