// Emulated peers on real time: how close the real stage's measured bubbles come to the
// simulator's for the same costs (the real stage's own taken from its measurement), per
// schedule. tests/pipeline/emulation_test.cc checks the same on simulated time, where they must
// agree exactly; this is the figure on a real machine, where the OS and caches add their noise.
// Prints, per schedule, the median over 7 steps (after a warm-up) of measured / simulated for
// the time waiting and for the BUBBLE windows.
//   build/bench/emulation_bench [schedules=1f1b,gpipe,zbh1,interleaved] [steps=8]
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "pipeline/simulator.h"
#include "trainer/data/token_shards.h"
#include "trainer/trainer.h"

namespace freeride {
namespace {

using pipeline::Op;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// A head-heavy 2-stage model: the last stage carries a 32768-token softmax (milliseconds per
// micro-batch, long bubbles against timer and scheduling noise).
Config EmulatedConfig(const std::string& dir, const std::string& schedule) {
  const std::string toml = absl::StrFormat(R"(
[run]
dir = "%s/run_%s"
seed = 3
[model]
n_layer = %d
n_head = 2
n_embd = 128
max_seq_len = 8
vocab_size = 32768
[data]
train = "%s/tokens.bin"
[train]
batch_size = 8
seq_len = 8
microbatches = 4
[parallel]
pp = 2
schedule = "%s"
chunks = %d
[runtime]
emulate_peers = true
threads = 1
)",
                                           dir, schedule, schedule == "interleaved" ? 4 : 2, dir,
                                           schedule, schedule == "interleaved" ? 2 : 1);
  absl::StatusOr<Config> config = ParseConfig(toml, "emulation_bench");
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", std::string(config.status().message()).c_str());
    std::exit(1);
  }
  return *config;
}

void Measure(const std::string& dir, const std::string& schedule, int steps) {
  auto trainer = Trainer::Create(EmulatedConfig(dir, schedule));
  if (!trainer.ok()) {
    std::fprintf(stderr, "%s\n", std::string(trainer.status().message()).c_str());
    std::exit(1);
  }
  Trainer& t = **trainer;
  std::vector<double> waits, windows;
  for (int step = 0; step < steps; ++step) {
    absl::StatusOr<StepStats> s = t.Step();
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.status().message()).c_str());
      std::exit(1);
    }
    if (step == 0) continue;  // warm-up: the bubbles are placed from its measurement
    const auto& instrs = t.schedule().per_stage[0];
    const auto& timeline = t.last_timeline();
    std::map<std::pair<int, Op>, double> sum;
    std::map<std::pair<int, Op>, int> count;
    double window = 0;
    for (size_t i = 0; i < timeline.size(); ++i) {
      const pipeline::Instr& in = instrs[timeline[i].index];
      sum[{in.chunk, in.op}] += (timeline[i].end_s - timeline[i].start_s) * 1e3;
      ++count[{in.chunk, in.op}];
      if (in.op == Op::kBubble && i + 1 < timeline.size()) {
        const pipeline::InstrTiming& next = timeline[i + 1];
        window +=
            ((next.wait_end_s > 0 ? next.wait_end_s : next.end_s) - timeline[i].start_s) * 1e3;
      }
    }
    auto mean = [&](int c, Op op) { return count[{c, op}] ? sum[{c, op}] / count[{c, op}] : 0.0; };
    // The simulator, given the emulated stage's calibrated costs and the real stage's measured.
    pipeline::CostModel cost = t.emulation_cost();
    pipeline::StageCost own{0, 0, 0};
    for (int c = 0; c < t.num_chunks(); ++c) {
      const bool split = count[{c, Op::kBackwardInput}] > 0;
      const pipeline::StageCost chunk{mean(c, Op::kForward),
                                      split ? mean(c, Op::kBackwardInput) : mean(c, Op::kBackward),
                                      split ? mean(c, Op::kBackwardWeight) : 0.0};
      own.f += chunk.f, own.b += chunk.b, own.w += chunk.w;
      if (!cost.chunks.empty()) cost.chunks[c * t.schedule().stages] = chunk;
    }
    cost.stages[0] = own;
    absl::StatusOr<pipeline::SimResult> sim = pipeline::Simulate(t.schedule(), cost);
    if (!sim.ok() || sim->stages[0].bubble <= 0) {
      std::fprintf(stderr, "%s: no simulated bubble\n", schedule.c_str());
      std::exit(1);
    }
    waits.push_back(s->bubble_s[0] * 1e3 / sim->stages[0].bubble);
    windows.push_back(window / sim->stages[0].bubble);
  }
  std::printf("| %s | %.3f | %.3f | %d |\n", schedule.c_str(), Median(waits), Median(windows),
              steps - 1);
}

}  // namespace
}  // namespace freeride

int main(int argc, char** argv) {
  using namespace freeride;
  const std::vector<std::string> schedules =
      absl::StrSplit(argc > 1 ? argv[1] : "1f1b,gpipe,zbh1,interleaved", ',');
  const int steps = argc > 2 ? std::atoi(argv[2]) : 8;
  openblas_set_num_threads(1);
  omp_set_num_threads(1);
  const std::string dir =
      (std::filesystem::temp_directory_path() / "freeride_emulation_bench").string();
  std::filesystem::create_directories(dir);
  std::mt19937 rng(17);
  std::vector<uint16_t> tokens(20000);
  for (auto& t : tokens) t = static_cast<uint16_t>(rng() % 64);
  if (!WriteTokenShard(dir + "/tokens.bin", tokens).ok()) return 1;
  std::printf(
      "| schedule | waiting, measured / simulated (median) | BUBBLE windows, same | steps |\n");
  std::printf("|---|---|---|---|\n");
  for (const std::string& schedule : schedules) Measure(dir, schedule, steps);
  return 0;
}
