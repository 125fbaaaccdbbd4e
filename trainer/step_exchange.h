// What every rank agrees on after a training step, in one sum over all ranks: each field is
// filled by the one rank that knows it (zeros elsewhere), so the sum hands every rank all of
// them. Named fields, laid out and read back in one place (Pack, Unpack), instead of offsets
// into a vector of doubles. Riding on the step's one sum, a stop is agreed without a
// collective of its own, and every rank stops after the same step.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace freeride {

struct StepExchange {
  // Per stage, as its replica 0 measured them.
  struct Stage {
    double bubble_s = 0;         // time waiting for peers in the step
    double host_peak_bytes = 0;  // its process's peak resident set
    double device_bytes = 0;     // its chunks' device memory
  };
  // Per BUBBLE of the schedule (with side tasks), filled by the rank that ran it.
  struct Bubble {
    bool ran = false;  // false: a stage without side tasks, or not really run (emulated)
    double predicted_s = 0, measured_s = 0, harvested_s = 0;
  };
  std::vector<Stage> stages;
  int stop_requests = 0;  // ranks asked to stop (a signal) before this step ended
  std::vector<Bubble> bubbles;
  std::vector<double> jobs;  // the fill jobs' values (JobRunner::Fill, Apply)
  // The overhead guard's: the ranks' step times summed (none without the guard).
  std::optional<double> step_s_sum;

  // An exchange of this shape with every field zero: what each rank fills its own part of.
  static StepExchange Shaped(int stages, size_t bubbles, size_t jobs, bool step_time);
  // The doubles the sum adds, in a layout fixed by the shape.
  std::vector<double> Pack() const;
  // Reads a summed Pack() of an exchange shaped as this one; an error naming both lengths
  // when they differ (ranks that disagree on the shape).
  absl::Status Unpack(absl::Span<const double> summed);
};

}  // namespace freeride
