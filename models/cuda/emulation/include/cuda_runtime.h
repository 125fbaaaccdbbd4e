// What nvcc puts in front of every .cu file, for the emulation build: the runtime API and the
// device-side model (thread indices, barriers, shuffles, launches). Force-included into the
// kernels' translation units; host .cc files include cuda_runtime_api.h as on real CUDA, and
// this header where they use its typed conveniences below (the toolkit keeps them here too).
#pragma once

#include "models/cuda/emulation/device.h"
#include "models/cuda/emulation/include/cuda_runtime_api.h"

template <typename T>
cudaError_t cudaMalloc(T** ptr, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
}
template <typename T>
cudaError_t cudaMallocHost(T** ptr, size_t bytes) {
  return cudaMallocHost(reinterpret_cast<void**>(ptr), bytes);
}
template <typename Kernel>
cudaError_t cudaFuncSetAttribute(Kernel* kernel, cudaFuncAttribute attr, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}
