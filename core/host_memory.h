// Host memory a run plans to hold, and how much the machine will let this process have. A
// batch too large for memory is refused before training with the largest buffers named,
// instead of ending in std::bad_alloc (or the OOM killer) partway through allocation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace freeride {

struct HostBuffer {
  std::string name;
  int64_t bytes = 0;
};

// What this process may still allocate: the least of the kernel's MemAvailable, the room left
// under the cgroup's memory.max, and the room under RLIMIT_AS and RLIMIT_DATA; `source` says
// which one limits.
struct HostMemoryBudget {
  int64_t bytes = 0;
  std::string source;
};
HostMemoryBudget AvailableHostMemory();

// All the memory the host gives this process, used or not: the kernel's MemTotal, or the
// cgroup's memory.max where that is less; `source` says which. What side work's room is
// planned against on the CPU (runtime.memory_fraction).
HostMemoryBudget TotalHostMemory();

// This process's resident set now (VmRSS: /proc/self/statm's resident pages).
int64_t ResidentBytes();

// OK when the plan fits in `budget` shared by `processes` ranks of one node; otherwise an
// error with the plan's total, its largest buffers and the budget.
absl::Status CheckHostMemoryPlan(const std::vector<HostBuffer>& plan,
                                 const HostMemoryBudget& budget, int processes);

int64_t TotalBytes(const std::vector<HostBuffer>& plan);
// "1.50 GiB", "12.0 MiB", "512 B".
std::string FormatBytes(int64_t bytes);

}  // namespace freeride
