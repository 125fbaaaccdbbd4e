// Time to generate + validate + simulate (bubble placement included) a schedule at scale.
// Usage: schedule_bench [repeats]; prints one line per (kind, p, m) with the best of repeats.
#include <cstdio>
#include <cstdlib>

#include "core/timer.h"
#include "pipeline/generators.h"
#include "pipeline/simulator.h"
#include "pipeline/validator.h"

using namespace freeride;
using namespace freeride::pipeline;

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 3;
  struct Case { ScheduleKind kind; int p, m, v; };
  const Case cases[] = {
      {ScheduleKind::k1F1B, 64, 512, 1},         {ScheduleKind::k1F1B, 128, 1024, 1},
      {ScheduleKind::kGPipe, 128, 1024, 1},      {ScheduleKind::kZBH1, 128, 1024, 1},
      {ScheduleKind::kInterleaved, 128, 1024, 2}};
  std::printf("%-12s %5s %6s %3s %10s %10s %10s %10s %12s\n", "kind", "p", "m", "v", "build_s",
              "validate_s", "simulate_s", "total_s", "instructions");
  for (const Case& c : cases) {
    ScheduleOptions o;
    o.kind = c.kind;
    o.stages = c.p;
    o.microbatches = c.m;
    o.chunks = c.v;
    double best[3] = {1e9, 1e9, 1e9};
    size_t instructions = 0;
    for (int r = 0; r < repeats; ++r) {
      Timer t;
      absl::StatusOr<Schedule> s = BuildSchedule(o);
      const double build = t.ElapsedSeconds();
      if (!s.ok()) return std::fprintf(stderr, "%s\n", std::string(s.status().message()).c_str()), 1;
      t.Restart();
      absl::Status valid = Validate(*s);
      const double validate = t.ElapsedSeconds();
      if (!valid.ok()) return std::fprintf(stderr, "%s\n", std::string(valid.message()).c_str()), 1;
      t.Restart();
      absl::StatusOr<SimResult> sim = Simulate(*s, o.cost);
      const double simulate = t.ElapsedSeconds();
      if (!sim.ok()) return 1;
      best[0] = std::min(best[0], build);
      best[1] = std::min(best[1], validate);
      best[2] = std::min(best[2], simulate);
      instructions = 0;
      for (const auto& stage : s->per_stage) instructions += stage.size();
    }
    std::printf("%-12s %5d %6d %3d %10.3f %10.3f %10.3f %10.3f %12zu\n",
                std::string(ScheduleKindName(c.kind)).c_str(), c.p, c.m, c.v, best[0], best[1],
                best[2], best[0] + best[1] + best[2], instructions);
  }
  return 0;
}
