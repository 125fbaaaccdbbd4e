// The global gradient norm's arithmetic, one order on every path (a stage's whole gradients, or
// ZeRO-1's shards of them): a stage's Σ g² per model unit (the embedding: wte, then wpe; each
// block: its tensors in llm.c order; the head: lnf_w, lnf_b, an untied lm_head) is the sum, in
// that order, of its tensor slices' sums, each the sum in order of the slice's chunk sums
// (cpu::ChunkSquares, kSquaresChunk elements from the slice's start). The chunk is the atom:
// whichever rank holds a chunk's summed gradients makes its sum, and the sums are put together
// in this fixed order, so that the norm's bits do not depend on how the gradients were split.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "models/gpt2_config.h"

namespace freeride {

// Elements [offset, offset + n) of a stage's parameter buffer (the layout's offsets).
struct ParamRange {
  int64_t offset = 0, n = 0;
  bool operator==(const ParamRange&) const = default;
};

// The tensor `range` lies in (an error naming the range where it crosses tensors or lies in
// none).
absl::StatusOr<ParamTensor> TensorAt(const ParamLayout& layout, const ParamRange& range);

// One tensor slice of the norm: a whole tensor, or one layer's part of a per-layer tensor.
struct NormSlice {
  int unit = 0;  // the stage's unit (GradSquaresByUnit's numbering)
  ParamTensor tensor{};
  int64_t offset = 0, n = 0;
  int64_t first_chunk = 0;  // its first chunk's place among the stage's chunk sums
};

struct NormPlan {
  std::vector<NormSlice> slices;  // in the order their sums are added
  int units = 0;
  int64_t chunks = 0;  // chunk sums of the whole stage
};

// Every present, non-empty slice of `layout`'s stage, in unit order.
NormPlan PlanGradNorm(const ParamLayout& layout);

// The norm's chunk: cpu::kSquaresChunk (models/cpu/optimizer.h; grad_norm.cc checks they
// agree), and the chunks of a slice of n elements.
inline constexpr int64_t kNormChunk = int64_t{1} << 16;
inline int64_t NormChunks(int64_t n) { return (n + kNormChunk - 1) / kNormChunk; }

// The units from every chunk's sum (`partials`: plan.chunks values, slice by slice): each
// slice's sum is 0 plus its chunks' in order, each unit 0 plus its slices' in order.
std::vector<double> UnitsFromChunkSquares(const NormPlan& plan, const double* partials);

}  // namespace freeride
