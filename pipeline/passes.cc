#include "pipeline/passes.h"

#include <algorithm>
#include <map>

#include "pipeline/simulator.h"

namespace freeride::pipeline {
namespace {

Instr Make(Op op, const Instr& from) {
  Instr instr;
  instr.op = op;
  instr.stage = from.stage;
  instr.chunk = from.chunk;
  instr.microbatch = from.microbatch;
  return instr;
}

Instr StepOp(Op op, int stage) {
  Instr instr;
  instr.op = op;
  instr.stage = stage;
  return instr;
}

bool IsStepOp(Op op) {
  return op == Op::kLoad || op == Op::kSendAct || op == Op::kRecvAct || op == Op::kSendGrad ||
         op == Op::kRecvGrad || op == Op::kReduceTied || op == Op::kReduceGrads ||
         op == Op::kOptimizer || op == Op::kBubble;
}

}  // namespace

void InsertCommunication(Schedule* schedule, bool data_parallel) {
  const int p = schedule->stages;
  const int last = p * schedule->chunks - 1;
  for (int stage = 0; stage < p; ++stage) {
    std::vector<Instr> out;
    for (const Instr& in : schedule->per_stage[stage]) {
      if (IsStepOp(in.op)) continue;
      const int k = VirtualStage(*schedule, in);
      if (in.op == Op::kForward) {
        if (k == 0 || k == last) out.push_back(Make(Op::kLoad, in));
        if (k > 0) out.push_back(Make(Op::kRecvAct, in));
        out.push_back(in);
        if (k < last) out.push_back(Make(Op::kSendAct, in));
      } else if (IsBackward(in.op)) {
        if (k < last) out.push_back(Make(Op::kRecvGrad, in));
        out.push_back(in);
        if (k > 0) out.push_back(Make(Op::kSendGrad, in));
      } else {
        out.push_back(in);
      }
    }
    // The tied embedding's two copies meet only when they live on different stages. A
    // post-validated head chunk makes its share of the tied gradient in I (or B), so its
    // stage posts the sum after the head's last one, not after its own last W: the embedding's
    // stage, which needs the sum before its next step's first forward, need not wait for the
    // head stage's deferred Ws.
    const int embedding = StageOfVirtual(*schedule, 0), head = StageOfVirtual(*schedule, last);
    if (embedding != head && stage == head && schedule->step_sync == StepSync::kPostValidate) {
      size_t after = out.size();
      for (size_t i = 0; i < out.size(); ++i) {
        if (IsBackward(out[i].op) && VirtualStage(*schedule, out[i]) == last) after = i + 1;
      }
      // After the gradient it sends back: the pipeline's critical path goes first.
      while (after < out.size() && out[after].op == Op::kSendGrad) ++after;
      out.insert(out.begin() + static_cast<long>(after), StepOp(Op::kReduceTied, stage));
    } else if (embedding != head && (stage == embedding || stage == head)) {
      out.push_back(StepOp(Op::kReduceTied, stage));
    }
    if (data_parallel) out.push_back(StepOp(Op::kReduceGrads, stage));
    out.push_back(StepOp(Op::kOptimizer, stage));
    schedule->per_stage[stage] = std::move(out);
  }
}

void ResolvePeers(Schedule* schedule) {
  const int last = schedule->stages * schedule->chunks - 1;
  for (auto& stage : schedule->per_stage) {
    for (Instr& in : stage) {
      const int k = VirtualStage(*schedule, in);
      if ((in.op == Op::kSendAct || in.op == Op::kRecvGrad) && k < last) {
        in.peer = StageOfVirtual(*schedule, k + 1);
      }
      if ((in.op == Op::kRecvAct || in.op == Op::kSendGrad) && k > 0) {
        in.peer = StageOfVirtual(*schedule, k - 1);
      }
    }
  }
}

void AssignBuffers(Schedule* schedule) {
  for (int stage = 0; stage < schedule->stages; ++stage) {
    auto& instrs = schedule->per_stage[stage];
    // The micro-batch's last backward op frees its slot: W when the backward is split.
    std::map<std::pair<int, int>, size_t> last_use;
    for (size_t i = 0; i < instrs.size(); ++i) {
      if (IsCompute(instrs[i].op)) last_use[{instrs[i].chunk, instrs[i].microbatch}] = i;
    }
    std::map<std::pair<int, int>, int> slot_of;
    std::vector<bool> used;
    for (size_t i = 0; i < instrs.size(); ++i) {
      Instr& in = instrs[i];
      if (!IsCompute(in.op)) continue;
      const std::pair<int, int> key{in.chunk, in.microbatch};
      if (in.op == Op::kForward && slot_of.count(key) == 0) {
        int slot = static_cast<int>(std::find(used.begin(), used.end(), false) - used.begin());
        if (slot == static_cast<int>(used.size())) used.push_back(false);
        used[slot] = true;
        slot_of[key] = slot;
      }
      auto it = slot_of.find(key);
      if (it == slot_of.end()) continue;  // a backward with no forward: the validator reports it
      in.buffer = it->second;
      if (last_use[key] == i) used[it->second] = false;
    }
    if (static_cast<int>(schedule->buffers_per_stage.size()) != schedule->stages) {
      schedule->buffers_per_stage.assign(schedule->stages, 0);
    }
    if (schedule->buffers_per_stage[stage] == 0) {
      schedule->buffers_per_stage[stage] = static_cast<int>(used.size());
    }
  }
}

absl::Status InsertBubbles(Schedule* schedule, const CostModel& cost) {
  for (auto& stage : schedule->per_stage) {
    std::erase_if(stage, [](const Instr& in) { return in.op == Op::kBubble; });
  }
  absl::StatusOr<SimResult> sim = Simulate(*schedule, cost);
  if (!sim.ok()) return sim.status();
  for (int s = 0; s < schedule->stages; ++s) {
    const auto& bubbles = sim->stages[s].bubbles;
    std::vector<Instr> out;
    size_t next = 0;
    auto& instrs = schedule->per_stage[s];
    for (size_t i = 0; i <= instrs.size(); ++i) {
      for (; next < bubbles.size() && bubbles[next].before_index == static_cast<int>(i); ++next) {
        Instr bubble = StepOp(Op::kBubble, s);
        bubble.bubble = bubbles[next].kind;
        bubble.duration_ms = bubbles[next].duration;
        bubble.free_bytes = bubbles[next].free_bytes;
        out.push_back(bubble);
      }
      if (i < instrs.size()) out.push_back(instrs[i]);
    }
    instrs = std::move(out);
  }
  return absl::OkStatus();
}

}  // namespace freeride::pipeline
