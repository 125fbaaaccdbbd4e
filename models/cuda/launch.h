// The two spellings the CUDA sources use instead of CUDA's own syntax, so that the same .cu
// files compile with nvcc and, in the emulation build (FREERIDE_CUDA_EMULATED), with the host
// compiler against models/cuda/emulation/:
//   FR_LAUNCH(grid, block, shared_bytes, stream, Kernel<T>)(args...);
//       Kernel<T><<<grid, block, shared_bytes, stream>>>(args...): the kernel is named with its
//       template arguments (the launch takes its address).
//   FR_DYNAMIC_SHARED(T, name);
//       extern __shared__ __align__(128) T name[]: the block's dynamic shared memory.
#pragma once

#ifdef FREERIDE_CUDA_EMULATED
#include "models/cuda/emulation/device.h"
#define FR_LAUNCH(grid, block, shared_bytes, stream, ...) \
  ::freeride::emu::MakeLauncher(#__VA_ARGS__, grid, block, shared_bytes, stream, __VA_ARGS__)
#define FR_DYNAMIC_SHARED(T, name) T* const name = static_cast<T*>(::freeride::emu::DynamicShared())
#else
#define FR_LAUNCH(grid, block, shared_bytes, stream, ...) \
  __VA_ARGS__<<<grid, block, shared_bytes, stream>>>
#define FR_DYNAMIC_SHARED(T, name) extern __shared__ __align__(128) T name[]
#endif
