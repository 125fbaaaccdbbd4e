// Sizes shared by the CUDA kernels and the memory plan that gives them their scratch space.
// Fixed sizes are what make the GPU reductions deterministic: the same partial sums, added in
// the same order, whatever the device. (Plain C++17: nvcc compiles the kernels that use it.)
#pragma once

#include <cstdint>

namespace freeride {

// Column sums (bias and LayerNorm gradients) split the rows into this many chunks.
inline constexpr int64_t kColumnChunks = 64;
// Blocks of a full reduction (loss sum, gradient norm), each leaving one fp64 partial sum.
inline constexpr int64_t kReduceBlocks = 256;
inline constexpr int64_t kCublasLtWorkspaceBytes = 32ll << 20;

}  // namespace freeride
