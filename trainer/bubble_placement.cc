// Where a pipeline's BUBBLEs go once its stages' costs are measured: after the first step, each
// stage's measured F/B/I/W times re-place them where this model's stages really wait.
#include <map>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/logging.h"
#include "pipeline/passes.h"
#include "pipeline/simulator.h"
#include "trainer/trainer.h"

namespace freeride {

// The schedule was built with uniform costs, so its BUBBLEs sit where equal stages would wait.
// After the first step each stage's measured F/B/I/W times place them where this model's
// stages really wait: that is what side tasks are offered.
absl::Status Trainer::PlaceBubblesFromMeasuredCosts(
    const std::vector<pipeline::InstrTiming>& timeline) {
  using pipeline::Op;
  const auto& instrs = executor_->instructions();
  const int pp = layout_.pp, V = pp * layout_.chunks;
  // Per virtual stage: f, b, w (ms) of this rank's chunks from replica 0, zeros
  // elsewhere, so a sum over the ranks assembles the pipeline's.
  std::vector<double> costs(3 * V, 0.0);
  if (layout_.replica == 0) {
    std::map<std::pair<int, Op>, double> sum;
    std::map<std::pair<int, Op>, int> count;
    bool split = false;
    for (const pipeline::InstrTiming& t : timeline) {
      const pipeline::Instr& in = instrs[t.index];
      sum[{in.chunk, in.op}] += (t.end_s - t.start_s) * 1e3;
      ++count[{in.chunk, in.op}];
      split = split || in.op == Op::kBackwardInput;
    }
    auto mean = [&](int c, Op op) { return count[{c, op}] ? sum[{c, op}] / count[{c, op}] : 0.0; };
    for (int c = 0; c < layout_.chunks; ++c) {
      const int v = VirtualStageOf(c);
      costs[3 * v] = mean(c, Op::kForward);
      costs[3 * v + 1] = split ? mean(c, Op::kBackwardInput) : mean(c, Op::kBackward);
      costs[3 * v + 2] = split ? mean(c, Op::kBackwardWeight) : 0.0;
    }
  }
  const bool emulate = config_.runtime.emulate_peers;
  if (!emulate) {
    if (absl::Status s = transport_->AllReduceSum(costs.data(), 3 * V, transport_->AllRanks(),
                                                  config_.runtime.comm_timeout_s);
        !s.ok()) {
      return s;
    }
  }
  // A stage's entry is the sum of its chunks'; with several chunks each keeps its own too.
  std::vector<pipeline::StageCost> stages(pp, pipeline::StageCost{0, 0, 0}), chunks(V);
  for (int v = 0; v < V; ++v) {
    chunks[v] = {costs[3 * v], costs[3 * v + 1], costs[3 * v + 2]};
    pipeline::StageCost& stage = stages[pipeline::StageOfVirtual(executor_->schedule(), v)];
    stage.f += chunks[v].f;
    stage.b += chunks[v].b;
    stage.w += chunks[v].w;
  }
  pipeline::CostModel cost;
  if (emulate) {
    // The emulated stages keep their calibrated costs; the real one takes its measurement.
    cost = emulation_cost_;
    cost.stages[layout_.stage] = stages[layout_.stage];
    for (int c = 0; c < layout_.chunks && !cost.chunks.empty(); ++c) {
      cost.chunks[VirtualStageOf(c)] = chunks[VirtualStageOf(c)];
    }
  } else {
    cost.stages = stages;
    if (layout_.chunks > 1) cost.chunks = chunks;
  }
  pipeline::Schedule schedule = executor_->schedule();
  if (absl::Status s = pipeline::InsertBubbles(&schedule, cost); !s.ok()) return s;
  if (leader()) {
    FR_LOG(INFO) << "bubbles placed from measured costs (ms): " << pipeline::FormatCostModel(cost);
    // What the simulator expects of each stage with those costs, to hold the run against.
    if (absl::StatusOr<pipeline::SimResult> sim = pipeline::Simulate(schedule, cost); sim.ok()) {
      std::vector<std::string> idle;
      for (const pipeline::StageResult& r : sim->stages) {
        idle.push_back(absl::StrFormat("%.3f", sim->step_time > 0 ? r.bubble / sim->step_time : 0));
      }
      FR_LOG(INFO) << absl::StrFormat("simulated step %.3f ms; idle fraction per stage: %s",
                                      sim->step_time, absl::StrJoin(idle, " "));
    }
  }
  executor_->set_schedule(std::move(schedule));
  IndexBubbles();
  schedule_seconds_per_ms_ = 1e-3;
  SeedBubblePredictions();
  return absl::OkStatus();
}

}  // namespace freeride
