#include "freeride/bubble_predictor.h"

#include <algorithm>

namespace freeride {
namespace {

constexpr double kBubbleAlpha = 0.5;  // weight of a new bubble measurement

}  // namespace

double BubblePredictor::Prediction::For(bool harvesting) const {
  if (measured_s[harvesting] > 0) return measured_s[harvesting];
  if (measured_s[!harvesting] > 0) return measured_s[!harvesting];
  return schedule_s;
}

void BubblePredictor::SetSchedule(const std::vector<pipeline::Instr>& instrs,
                                  double seconds_per_ms, int64_t free_bytes) {
  keys_ = pipeline::BubbleKeys(instrs);
  double run_ms = 0;  // this BUBBLE's and those just before it, back to another instruction
  for (size_t i = 0; i < instrs.size(); ++i) {
    if (instrs[i].op != pipeline::Op::kBubble) {
      run_ms = 0;
      continue;
    }
    run_ms += instrs[i].duration_ms;
    // A BUBBLE right before another is never ended (the stage waits only at the instruction
    // after the last), so never measured: the last of them stands for the whole wait, and
    // only it takes the schedule's figure, theirs summed.
    const bool last = i + 1 == instrs.size() || instrs[i + 1].op != pipeline::Op::kBubble;
    Prediction& p = predictions_[keys_[i]];
    const double predicted = last ? run_ms * seconds_per_ms : 0.0;
    p.schedule_s = predicted > 0 ? predicted : -1.0;
    p.free_bytes = instrs[i].free_bytes >= 0 ? instrs[i].free_bytes : free_bytes;
  }
  // The new list's indices begin a step of their own.
  last_index_ = std::numeric_limits<int>::max();
}

BubblePredictor::Prediction& BubblePredictor::At(int index, pipeline::BubbleKind kind) {
  if (index < static_cast<int>(keys_.size()) && keys_[index].anchor >= 0) {
    return predictions_[keys_[index]];
  }
  return predictions_[pipeline::BubbleKey{-1 - index, kind, 0}];
}

BubblePredictor::Begun BubblePredictor::Begin(int index, pipeline::BubbleKind kind,
                                              bool harvesting) {
  if (index <= last_index_) ++step_;
  last_index_ = index;
  Prediction& p = At(index, kind);
  p.seen_in_step = step_;
  Begun begun;
  begun.predicted_s = p.For(harvesting);
  begun.from_schedule = p.measured_s[0] <= 0 && p.measured_s[1] <= 0 && begun.predicted_s > 0;
  return begun;
}

void BubblePredictor::Learn(int index, pipeline::BubbleKind kind, bool harvesting,
                            const Begun& begun, double measured_s, double overrun_s,
                            bool end_hidden, bool late_known) {
  double& p = At(index, kind).measured_s[harvesting];
  if (p <= 0 && end_hidden && begun.from_schedule) {
    // The first measurement of a bubble harvested on the schedule's figure, whose end side work
    // hid: it says as little as any hidden end.
    p = std::min(begun.predicted_s, measured_s) * (1 - margin_);
  } else if (p <= 0) {
    p = measured_s - overrun_s;
  } else if (end_hidden) {
    p = std::min(p, measured_s) * (1 - margin_);
  } else if (overrun_s == 0 || late_known) {
    p = (1 - kBubbleAlpha) * p + kBubbleAlpha * (measured_s - overrun_s);
  } else {
    p *= 0.9;
  }
}

double BubblePredictor::Longest(bool harvesting) const {
  double longest = 0;
  for (const auto& [key, p] : predictions_) {
    if (p.seen_in_step == step_) longest = std::max(longest, p.For(harvesting));
  }
  return longest;
}

int64_t BubblePredictor::free_bytes(int index) const {
  if (index >= static_cast<int>(keys_.size()) || keys_[index].anchor < 0) return -1;
  const auto it = predictions_.find(keys_[index]);
  return it == predictions_.end() ? -1 : it->second.free_bytes;
}

}  // namespace freeride
