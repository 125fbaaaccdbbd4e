// CUDA's function and variable qualifiers for the emulation build, where every function is a
// host function: __global__, __device__ and __host__ vanish, __shared__ variables become one
// copy per block (a block runs on one host thread at a time, so `static thread_local` is that
// copy), and the hints (__launch_bounds__, __forceinline__) keep their host meaning or none
// (__restrict__ is GCC's own keyword already).
#pragma once

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __shared__ static thread_local
#define __constant__ static
