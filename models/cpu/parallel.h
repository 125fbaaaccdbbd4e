// When a CPU loop is worth a team of OpenMP threads. Forking and joining a team costs a few
// microseconds on an idle host; on a busy one (ctest -j beside other work, side tasks beside
// training) a barrier can wait a whole scheduler slice for a descheduled thread, which made a
// model of 8×32 matrices (the gradient checks) run over 100 times slower. Below the threshold
// a loop runs on the calling thread. Only the split of the work changes, never the arithmetic:
// every kernel computes each output element on one thread in a fixed order, so the bits are
// the same either way (ThreadCountTest).
#pragma once

#include <cstdint>

namespace freeride::cpu {

// `work`: about how many scalar operations the loop does in all.
inline bool ParallelWorth(int64_t work) { return work >= (int64_t{1} << 15); }

}  // namespace freeride::cpu
