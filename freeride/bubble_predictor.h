// The side-task executor's bubble predictor: one predictor per rank, the schedule's figure
// corrected by measurement. Until a BUBBLE is measured its prediction is what the schedule
// placed it with (SetSchedule); each measurement then corrects it, per harvesting state (off,
// on: a bubble can last longer while the peers harvest too, a late peer's cold caches, and
// blocks that alternate would otherwise predict each from the other). A bubble is known by its
// pipeline::BubbleKey, so it keeps its history when the bubbles are placed again.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <vector>

#include "pipeline/schedule.h"

namespace freeride {

class BubblePredictor {
 public:
  // `margin`: ExecutorOptions::margin, how far a prediction drops below a hidden end.
  explicit BubblePredictor(double margin) : margin_(margin) {}

  // The stage's instructions as the schedule placed its BUBBLEs (again, after a re-placement):
  // each BUBBLE's duration_ms × `seconds_per_ms` (0: the costs were not in ms, nothing is
  // predicted) until it is measured; its free_bytes, where < 0 `free_bytes`. Without a call,
  // each bubble is known by its index and measured first.
  void SetSchedule(const std::vector<pipeline::Instr>& instrs, double seconds_per_ms,
                   int64_t free_bytes);

  struct Begun {
    double predicted_s = -1;     // <= 0: none, measure first
    bool from_schedule = false;  // the schedule's figure: nothing measured yet
  };
  // BUBBLE `index` begins: its prediction in this harvesting state (its own measurement, else
  // the other state's, else the schedule's). A step visits its bubbles in ascending order, so
  // an index not above the last one begins the next step.
  Begun Begin(int index, pipeline::BubbleKind kind, bool harvesting);

  // What BUBBLE `index`, begun as `begun`, measured: `measured_s` from its start to the end of
  // the wait, of which side work made `overrun_s`. `end_hidden`: side work ran to the end of a
  // bubble it could not poll, so the wait's true end is unknown; `late_known`: the overrun is
  // exact (a paused worker's).
  void Learn(int index, pipeline::BubbleKind kind, bool harvesting, const Begun& begun,
             double measured_s, double overrun_s, bool end_hidden, bool late_known);

  // The longest of the last step's bubbles, as predicted (0 before any).
  double Longest(bool harvesting) const;
  // The device memory free in BUBBLE `index` (< 0: unknown).
  int64_t free_bytes(int index) const;

 private:
  struct Prediction {
    double schedule_s = -1;
    double measured_s[2] = {-1, -1};
    int64_t free_bytes = -1;
    int64_t seen_in_step = -1;
    double For(bool harvesting) const;
  };
  Prediction& At(int index, pipeline::BubbleKind kind);

  double margin_;
  std::map<pipeline::BubbleKey, Prediction> predictions_;
  // Per BUBBLE index, its key (SetSchedule); an index past them is its own key (anchor < 0).
  std::vector<pipeline::BubbleKey> keys_;
  int64_t step_ = 0;
  int last_index_ = std::numeric_limits<int>::max();
};

}  // namespace freeride
