// The gradient norm and AdamW over every parameter tensor of a chunk in one launch each (plus
// one small launch combining the norm's partials), over the table multi_tensor_table.h builds
// once per chunk. The per-tensor reference is SumOfSquares and AdamW (kernels.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "models/cuda/kernels.h"
#include "models/cuda/multi_tensor_table.h"

namespace freeride::cuda {

// units[u] = Σ g² over unit u's chunks (fp64): one block per counted chunk writes its partial
// to chunk_partials [counted chunks], then one block per unit adds its range of partials in a
// fixed order. `chunks` and `unit_begin` are the table's, on the device.
void MultiTensorGradSquares(double* units, double* chunk_partials, const float* grads,
                            const TensorChunk* chunks, const int32_t* unit_begin,
                            int64_t counted_chunks, int64_t num_units, cudaStream_t stream);

// The two halves of MultiTensorGradSquares, for ZeRO-1 (each rank makes the partials of its
// share's chunks, the data-parallel group sums them, every rank combines them, the same bits):
// the first `counted_chunks` chunks' partials, and units from partials.
void MultiTensorChunkSquares(double* chunk_partials, const float* grads, const TensorChunk* chunks,
                             int64_t counted_chunks, cudaStream_t stream);
void MultiTensorCombineUnits(double* units, const double* chunk_partials, const int32_t* unit_begin,
                             int64_t num_units, cudaStream_t stream);

// AdamW (the per-tensor kernel's arithmetic, AdamWElement) over all `num_chunks` chunks, the
// moments of each at its moment_offset (and with `packed_master`, a ZeRO-1 share's fp32 master
// in bf16, the master too):
// args.weight_decay for the decayed ones, 0 for the others; `compute` (bf16 or null) gets the
// rounded copy, at the chunk's offset.
void MultiTensorAdamW(float* master, bf16* compute, const float* grad, float* m, float* v,
                      const TensorChunk* chunks, int64_t num_chunks, const AdamWArgs& args,
                      cudaStream_t stream, bool packed_master = false);

}  // namespace freeride::cuda
