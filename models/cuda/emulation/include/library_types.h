// CUDA's element type tags for the emulation build (-DFREERIDE_CUDA=EMULATE), with CUDA's
// numeric values: the cuBLAS call sites store them (LtKey) and the values must mean the same
// as on a real build. Only the types the emulated libraries know of are listed.
#pragma once

enum cudaDataType_t {
  CUDA_R_32F = 0,
  CUDA_R_64F = 1,
  CUDA_R_16F = 2,
  CUDA_R_16BF = 14,
};
using cudaDataType = cudaDataType_t;
