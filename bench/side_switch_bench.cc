// The cost of switching to a side task and back, in process against in a worker process: the
// wall time of a step beyond the step's own work (spin, 10 µs of busy work), and for a worker
// the pause (SIGSTOP at a deadline, until the rank has the core back) and resume costs.
//   build/bench/side_switch_bench [steps=20000]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/timer.h"
#include "freeride/task_host.h"

namespace freeride {
namespace {

std::unique_ptr<TaskHost> Host(const std::string& isolation, double step_ms) {
  SideTaskSpec spec{"spin", "spin", "", 0, 0, {{"step_ms", step_ms}}};
  spec.isolation = isolation;
  HostOptions options;
  options.results_dir = (std::filesystem::temp_directory_path() / "side_switch_bench").string();
  std::filesystem::create_directories(options.results_dir);
  auto host = MakeTaskHost(spec, options);
  if (!host.ok() || !(*host)->Create().ok() || !(*host)->Load().ok()) {
    std::fprintf(stderr, "cannot start a %s spin task\n", isolation.c_str());
    std::exit(1);
  }
  return *std::move(host);
}

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * (v.size() - 1))];
}

void StepCost(const std::string& isolation, int steps) {
  constexpr double kWorkMs = 0.01;
  auto host = Host(isolation, kWorkMs);
  const auto never = [] { return false; };
  std::vector<double> over;
  for (int i = 0; i < steps; ++i) {
    const double start = MonotonicSeconds();
    HostStep out = host->Step(start + 10, never);
    const double took = MonotonicSeconds() - start;
    if (out.kind != HostStep::Kind::kDone) std::exit(1);
    over.push_back(took - kWorkMs * 1e-3);
  }
  double sum = 0;
  for (double v : over) sum += v;
  std::printf("%-10s step switch cost: mean %7.2f us  median %7.2f us  p99 %7.2f us  (%d steps)\n",
              isolation.c_str(), 1e6 * sum / steps, 1e6 * Percentile(over, 0.5),
              1e6 * Percentile(over, 0.99), steps);
  host->Release();
}

void PauseCost(int pauses) {
  // 5 ms steps given 0.5 ms each: every call ends in a pause at the deadline.
  auto host = Host("process", 5.0);
  const auto never = [] { return false; };
  std::vector<double> late, resume;
  for (int i = 0; i < pauses; ++i) {
    const double start = MonotonicSeconds();
    const double deadline = start + 0.5e-3;
    HostStep out = host->Step(deadline, never);
    const double back = MonotonicSeconds();
    if (out.kind == HostStep::Kind::kFailed) std::exit(1);
    if (out.kind == HostStep::Kind::kPaused) late.push_back(back - deadline);
  }
  std::printf("process    pause at a deadline: the rank is back %.1f us (median), %.1f us (p99) "
              "after it (%zu pauses, 100 us poll)\n",
              1e6 * Percentile(late, 0.5), 1e6 * Percentile(late, 0.99), late.size());
  host->Release();
}

}  // namespace
}  // namespace freeride

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 20000;
  freeride::StepCost("inprocess", steps);
  freeride::StepCost("process", steps);
  freeride::PauseCost(std::max(100, steps / 20));
  return 0;
}
