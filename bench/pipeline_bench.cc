// A CPU pipeline next to its simulation: run under `mpirun -n P`, it trains a small GPT as a
// P-stage pipeline on random tokens, measures each stage's F/B/I/W and optimizer times from
// the executor's timeline, feeds them to the schedule simulator, and prints measured against
// predicted step time and per-stage bubble (bubble = step time − F/B/I/W/optimizer time, the
// simulator's definition; an instruction's own waiting counts as bubble).
// Usage: mpirun -n 2 build/bench/pipeline_bench [schedule=1f1b] [microbatches=8] [steps=6]
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>

#include "absl/strings/str_format.h"
#include "pipeline/simulator.h"
#include "trainer/data/token_shards.h"
#include "trainer/trainer.h"

using namespace freeride;
using pipeline::Op;

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::string schedule = argc > 1 ? argv[1] : "1f1b";
  const int m = argc > 2 ? std::atoi(argv[2]) : 8;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 6;
  const std::string dir = (std::filesystem::temp_directory_path() / "freeride_pp_bench").string();
  if (rank == 0) {
    std::filesystem::create_directories(dir);
    std::mt19937 rng(1);
    std::vector<uint16_t> tokens(200000);
    for (auto& t : tokens) t = static_cast<uint16_t>(rng() % 8192);
    if (!WriteTokenShard(dir + "/train.bin", tokens).ok()) MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string toml = absl::StrFormat(R"(
[run]
dir = "%s"
[model]
n_layer = 8
n_head = 4
n_embd = 256
max_seq_len = 64
vocab_size = 8192
[data]
train = "%s/train.bin"
[train]
batch_size = %d
seq_len = 64
microbatches = %d
steps = %d
[parallel]
pp = %d
schedule = "%s"
)", dir, dir, 2 * m, m, steps + 1, size, schedule);
  auto config = ParseConfig(toml, "pipeline_bench");
  if (!config.ok()) return std::fprintf(stderr, "%s\n", std::string(config.status().message()).c_str()), 1;
  auto transport = pipeline::MakeMpiTransport();
  auto trainer = Trainer::Create(*config, transport.get());
  if (!trainer.ok()) {
    std::fprintf(stderr, "%s\n", std::string(trainer.status().message()).c_str());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  Trainer& t = **trainer;
  (void)*t.Step();  // warm-up
  std::map<Op, double> sum;
  std::map<Op, int> count;
  double step_s = 0, busy_s = 0;
  const auto& instrs = t.schedule().per_stage[t.layout().stage];
  for (int i = 0; i < steps; ++i) {
    const StepStats s = *t.Step();
    step_s += s.step_s;
    for (const pipeline::InstrTiming& timing : t.last_timeline()) {
      const Op op = instrs[timing.index].op;
      // Time an instruction spent waiting (receives, sums) is bubble, not work.
      const double waited = timing.wait_end_s > 0 ? timing.wait_end_s - timing.start_s : 0;
      const double d = timing.end_s - timing.start_s - waited;
      sum[op] += d;
      ++count[op];
      if (pipeline::IsCompute(op) || op == Op::kOptimizer) busy_s += d;
    }
  }
  auto mean_ms = [&](Op op) { return count[op] ? sum[op] / count[op] * 1e3 : 0.0; };
  // Per stage: f, b, w, optimizer (ms), measured step and bubble (s); summed over ranks with
  // zeros elsewhere.
  std::vector<double> table(6 * size, 0.0);
  const int st = t.layout().stage;
  const bool split = count[Op::kBackwardInput] > 0;
  table[6 * st + 0] = mean_ms(Op::kForward);
  table[6 * st + 1] = split ? mean_ms(Op::kBackwardInput) : mean_ms(Op::kBackward);
  table[6 * st + 2] = split ? mean_ms(Op::kBackwardWeight) : 0.0;
  table[6 * st + 3] = mean_ms(Op::kOptimizer);
  table[6 * st + 4] = step_s / steps;
  table[6 * st + 5] = (step_s - busy_s) / steps;
  MPI_Allreduce(MPI_IN_PLACE, table.data(), static_cast<int>(table.size()), MPI_DOUBLE, MPI_SUM,
                MPI_COMM_WORLD);
  if (rank == 0) {
    pipeline::CostModel cost;
    double optimizer = 0;  // the slowest stage's update (the barrier waits for it)
    for (int s = 0; s < size; ++s) {
      cost.stages.push_back({table[6 * s], table[6 * s + 1], table[6 * s + 2]});
      optimizer = std::max(optimizer, table[6 * s + 3]);
    }
    cost.optimizer = optimizer;
    auto sim = pipeline::Simulate(t.schedule(), cost);
    if (!sim.ok()) return std::fprintf(stderr, "%s\n", std::string(sim.status().message()).c_str()), 1;
    std::printf("%s, %d stages, %d micro-batches, %d timed steps; costs measured (ms): %s\n",
                schedule.c_str(), size, m, steps, pipeline::FormatCostModel(cost).c_str());
    std::printf("%-6s %12s %12s %8s %14s %14s %8s\n", "stage", "step_s", "predicted", "error",
                "bubble_s", "predicted", "error");
    for (int s = 0; s < size; ++s) {
      const double step = table[6 * s + 4], bubble = table[6 * s + 5];
      const double pstep = sim->step_time / 1e3, pbubble = sim->stages[s].bubble / 1e3;
      std::printf("%-6d %12.4f %12.4f %7.1f%% %14.4f %14.4f %7.1f%%\n", s, step, pstep,
                  100 * (pstep - step) / step, bubble, pbubble, 100 * (pbubble - bubble) / bubble);
    }
    std::filesystem::remove_all(dir);
  }
  trainer->reset();
  transport.reset();
  MPI_Finalize();
  return 0;
}
