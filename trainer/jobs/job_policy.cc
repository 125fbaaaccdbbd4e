#include "trainer/jobs/job_policy.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace freeride {

absl::StatusOr<JobPolicy> ParseJobPolicy(absl::string_view name) {
  if (name == "fifo") return JobPolicy::kFifo;
  if (name == "priority") return JobPolicy::kPriority;
  if (name == "shortest_first") return JobPolicy::kShortestFirst;
  return absl::InvalidArgumentError(absl::StrCat(
      "freeride.job_policy: expected one of \"fifo\", \"priority\", \"shortest_first\", found \"",
      name, "\""));
}

std::vector<int64_t> PlacementOrder(const std::vector<Job>& pending, JobPolicy policy, double now_s,
                                    double age_limit_s) {
  std::vector<const Job*> order;
  for (const Job& job : pending) order.push_back(&job);
  // Ids grow with submission: the tie-break of every policy.
  auto key = [&](const Job* job) {
    switch (policy) {
      case JobPolicy::kFifo:
        return std::tuple<int, double, int64_t>{0, 0.0, job->id};
      case JobPolicy::kPriority:
        return std::tuple<int, double, int64_t>{0, -static_cast<double>(job->priority), job->id};
      case JobPolicy::kShortestFirst:
        break;
    }
    if (now_s - job->submitted_s > age_limit_s) {
      return std::tuple<int, double, int64_t>{0, job->submitted_s, job->id};
    }
    return std::tuple<int, double, int64_t>{job->work_s > 0 ? 1 : 2, job->work_s, job->id};
  };
  std::sort(order.begin(), order.end(),
            [&](const Job* a, const Job* b) { return key(a) < key(b); });
  std::vector<int64_t> ids;
  for (const Job* job : order) ids.push_back(job->id);
  return ids;
}

}  // namespace freeride
