#include "core/host_memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace freeride {
namespace {

constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max();

// A /proc/meminfo line's value ("MemAvailable:"), in bytes.
int64_t MemInfo(absl::string_view name) {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == name) return kib * 1024;
  }
  return kUnlimited;
}

int64_t ReadNumberFile(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text)) return -1;
  int64_t value = 0;
  return absl::SimpleAtoi(text, &value) ? value : kUnlimited;  // "max" → unlimited
}

// Room under the cgroup v2 memory limit of this process's group, if it has one.
int64_t CgroupRoom() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, "0::")) continue;
    const std::string dir = "/sys/fs/cgroup" + line.substr(3);
    const int64_t max = ReadNumberFile(dir + "/memory.max");
    const int64_t current = ReadNumberFile(dir + "/memory.current");
    if (max <= 0 || max == kUnlimited || current < 0) return kUnlimited;
    return std::max<int64_t>(0, max - current);
  }
  return kUnlimited;
}

// The memory.max of this process's cgroup (v2), if it has one.
int64_t CgroupMax() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, "0::")) continue;
    const int64_t max = ReadNumberFile("/sys/fs/cgroup" + line.substr(3) + "/memory.max");
    return max <= 0 ? kUnlimited : max;
  }
  return kUnlimited;
}

// Room under an address-space or data-segment rlimit (ulimit -v / -d).
int64_t RlimitRoom(int resource) {
  struct rlimit limit;
  if (getrlimit(resource, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return kUnlimited;
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0;
  statm >> pages;
  const int64_t used = pages * sysconf(_SC_PAGESIZE);
  return std::max<int64_t>(0, static_cast<int64_t>(limit.rlim_cur) - used);
}

}  // namespace

int64_t TotalBytes(const std::vector<HostBuffer>& plan) {
  int64_t total = 0;
  for (const HostBuffer& b : plan) total += b.bytes;
  return total;
}

std::string FormatBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) return absl::StrFormat("%.2f GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return absl::StrFormat("%.1f MiB", b / (1024.0 * 1024));
  if (b >= 1024.0) return absl::StrFormat("%.1f KiB", b / 1024.0);
  return absl::StrFormat("%d B", bytes);
}

HostMemoryBudget AvailableHostMemory() {
  HostMemoryBudget budget{MemInfo("MemAvailable:"), "MemAvailable in /proc/meminfo"};
  for (const auto& [room, source] :
       {std::pair{CgroupRoom(), "the cgroup's memory.max"},
        std::pair{RlimitRoom(RLIMIT_AS), "RLIMIT_AS (ulimit -v)"},
        std::pair{RlimitRoom(RLIMIT_DATA), "RLIMIT_DATA (ulimit -d)"}}) {
    if (room < budget.bytes) budget = {room, source};
  }
  return budget;
}

HostMemoryBudget TotalHostMemory() {
  HostMemoryBudget total{MemInfo("MemTotal:"), "MemTotal in /proc/meminfo"};
  if (const int64_t max = CgroupMax(); max < total.bytes) total = {max, "the cgroup's memory.max"};
  return total;
}

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

absl::Status CheckHostMemoryPlan(const std::vector<HostBuffer>& plan,
                                 const HostMemoryBudget& budget, int processes) {
  const int64_t total = TotalBytes(plan);
  const int64_t share = budget.bytes / std::max(1, processes);
  if (total <= share) return absl::OkStatus();
  std::vector<HostBuffer> largest = plan;
  std::sort(largest.begin(), largest.end(),
            [](const HostBuffer& a, const HostBuffer& b) { return a.bytes > b.bytes; });
  largest.resize(std::min<size_t>(largest.size(), 4));
  std::vector<std::string> named;
  for (const HostBuffer& b : largest) named.push_back(b.name + " " + FormatBytes(b.bytes));
  return absl::ResourceExhaustedError(absl::StrFormat(
      "this rank plans %s of host memory but %s is available (%s%s); largest: %s",
      FormatBytes(total), FormatBytes(share), budget.source,
      processes > 1 ? absl::StrFormat(", shared by %d ranks on this node", processes) : "",
      absl::StrJoin(named, ", ")));
}

}  // namespace freeride
