#include "trainer/step_exchange.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace freeride {
namespace {

constexpr size_t kStageFields = 3;
constexpr size_t kBubbleFields = 4;

}  // namespace

StepExchange StepExchange::Shaped(int stages, size_t bubbles, size_t jobs, bool step_time) {
  StepExchange e;
  e.stages.resize(static_cast<size_t>(stages));
  e.bubbles.resize(bubbles);
  e.jobs.resize(jobs);
  if (step_time) e.step_s_sum = 0.0;
  return e;
}

std::vector<double> StepExchange::Pack() const {
  std::vector<double> v;
  v.reserve(kStageFields * stages.size() + 1 + kBubbleFields * bubbles.size() + jobs.size() + 1);
  for (const Stage& s : stages) v.insert(v.end(), {s.bubble_s, s.host_peak_bytes, s.device_bytes});
  v.push_back(stop_requests);
  for (const Bubble& b : bubbles) {
    v.insert(v.end(), {b.ran ? 1.0 : 0.0, b.predicted_s, b.measured_s, b.harvested_s});
  }
  v.insert(v.end(), jobs.begin(), jobs.end());
  if (step_s_sum) v.push_back(*step_s_sum);
  return v;
}

absl::Status StepExchange::Unpack(absl::Span<const double> summed) {
  const size_t want = kStageFields * stages.size() + 1 + kBubbleFields * bubbles.size() +
                      jobs.size() + (step_s_sum ? 1 : 0);
  if (summed.size() != want) {
    return absl::InternalError(absl::StrFormat(
        "the step's exchange has %d values where this rank's shape (%d stages, %d bubbles, %d "
        "job values%s) has %d: the ranks disagree on it",
        summed.size(), stages.size(), bubbles.size(), jobs.size(),
        step_s_sum ? ", a step time" : "", want));
  }
  const double* v = summed.data();
  for (Stage& s : stages) {
    s.bubble_s = *v++;
    s.host_peak_bytes = *v++;
    s.device_bytes = *v++;
  }
  stop_requests = static_cast<int>(std::lround(*v++));
  for (Bubble& b : bubbles) {
    // Exactly one rank runs a bubble: the flag sums to 1 there, 0 elsewhere.
    b.ran = *v++ != 0;
    b.predicted_s = *v++;
    b.measured_s = *v++;
    b.harvested_s = *v++;
  }
  for (double& j : jobs) j = *v++;
  if (step_s_sum) step_s_sum = *v++;
  return absl::OkStatus();
}

}  // namespace freeride
