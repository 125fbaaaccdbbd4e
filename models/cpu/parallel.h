// When a CPU loop is worth a team of OpenMP threads. Forking and joining a team costs a few
// microseconds on an idle host; on a busy one (ctest -j beside other work, side tasks beside
// training) a barrier can wait a whole scheduler slice for a descheduled thread, which made a
// model of 8×32 matrices (the gradient checks) run over 100 times slower. Below the threshold
// a loop runs on the calling thread. Only the split of the work changes, never the arithmetic:
// every kernel computes each output element on one thread in a fixed order, so the bits are
// the same either way (ThreadCountTest).
#pragma once

#include <algorithm>
#include <cstdint>

namespace freeride::cpu {

// `work`: about how many scalar operations the loop does in all.
inline bool ParallelWorth(int64_t work) { return work >= (int64_t{1} << 15); }

// Calls `block(lo, hi)` for the column blocks [lo, hi) of `C` columns, 64 wide, a block to a
// thread: a per-column sum over rows that walks the rows in order inside `block` is then
// deterministic (the weight and bias gradients of norms and matrix products).
template <typename Block>
void ForEachColumnBlock(int64_t C, int64_t work, const Block& block) {
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (ParallelWorth(work))
  for (int64_t blk = 0; blk < blocks; ++blk)
    block(blk * kBlock, std::min(C, blk * kBlock + kBlock));
}

}  // namespace freeride::cpu
