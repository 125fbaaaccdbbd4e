// Which pending fill job a training places next (freeride.job_policy), and the guarantee each
// policy keeps:
//   fifo            in submission order: every job is offered once all jobs before it were.
//   priority        the highest `priority` first, equals in submission order; a lower job
//                   waits as long as higher ones keep coming (no guarantee against that).
//   shortest_first  the least estimated work (`freeride submit --work`) first, jobs without
//                   an estimate after those with one, in submission order; but a job pending
//                   longer than freeride.job_age_limit_s goes before all others (oldest first),
//                   so none waits much past the age limit whatever shorter ones arrive.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainer/jobs/job_store.h"

namespace freeride {

enum class JobPolicy { kFifo, kPriority, kShortestFirst };
absl::StatusOr<JobPolicy> ParseJobPolicy(absl::string_view name);

// The ids of `pending` in the order `policy` offers them, at wall-clock time `now_s`.
std::vector<int64_t> PlacementOrder(const std::vector<Job>& pending, JobPolicy policy, double now_s,
                                    double age_limit_s);

}  // namespace freeride
