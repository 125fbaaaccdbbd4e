// The overhead budget in a training run (freeride.max_overhead, freeride.overhead_check): the
// guard of trainer/overhead_guard.h fed each step's time as every rank agreed it, its levels
// applied to this rank's executor, and each decision a metrics record and a log line.
#include <algorithm>

#include "absl/strings/str_format.h"
#include "core/logging.h"
#include "trainer/trainer.h"

namespace freeride {

bool Trainer::HarvestingStep(int64_t step) const {
  if (guard_) return guard_->Harvesting(step) && guard_->level() != SideLevel::kPaused;
  const int64_t every = config_.freeride.alternate_every;
  return every == 0 || (step / every) % 2 == 0;
}

void Trainer::ApplySideLevel(SideLevel level) {
  if (!side_) return;
  switch (level) {
    case SideLevel::kFull:
      side_->set_offer(1.0, 1);
      break;
    case SideLevel::kShorter:
      side_->set_offer(0.5, 1);
      break;
    case SideLevel::kFewer:
    case SideLevel::kBenched:
    case SideLevel::kPaused:  // harvests in no step (HarvestingStep)
      side_->set_offer(0.5, 2);
      break;
  }
  const bool bench = level == SideLevel::kBenched || level == SideLevel::kPaused;
  if (!bench && benched_task_ >= 0) {
    side_->set_benched(benched_task_, false);
    benched_task_ = -1;
  } else if (bench && benched_task_ < 0) {
    // The costliest: the throughput task that has taken the most bubble time on this rank
    // (serving is never benched: its requests are served in every bubble).
    const HarvestReport report = side_->Report();
    double most = 0;
    for (size_t id = 0; id < report.tasks.size(); ++id) {
      if (report.tasks[id].state == "LOADED" && report.tasks[id].harvested_s > most &&
          !side_->latency_sensitive(static_cast<int>(id))) {
        most = report.tasks[id].harvested_s;
        benched_task_ = static_cast<int>(id);
      }
    }
    if (benched_task_ >= 0) {
      side_->set_benched(benched_task_, true);
      FR_LOG(INFO) << absl::StrFormat(
          "overhead budget: side task '%s' benched on rank %d (the most bubble time here, %.3f s)",
          report.tasks[benched_task_].name, transport_->rank(), most);
    }
  }
}

void Trainer::ObserveOverhead(int64_t step, double mean_step_s) {
  if (!guard_) return;
  const std::optional<GuardDecision> d = guard_->Observe(step, mean_step_s);
  if (!d) return;
  ApplySideLevel(d->to);
  if (!leader()) return;
  const double budget = guard_->options().budget;
  if (d->backed_off()) {
    FR_LOG(WARN) << "overhead budget: " << d->Describe(budget);
  } else {
    FR_LOG(INFO) << "overhead budget: " << d->Describe(budget);
  }
  const Estimate& e = d->overhead;
  WriteMetric(absl::StrFormat(
      "{\"kind\": \"overhead_guard\", \"step\": %d, \"action\": \"%s\", \"from\": \"%s\", "
      "\"to\": \"%s\", \"overhead\": %.6f, \"overhead_ci\": %s, \"pairs\": %d, "
      "\"budget\": %.6f}",
      d->step, d->backed_off() ? "back_off" : "probe_up", SideLevelName(d->from),
      SideLevelName(d->to), e.mean,
      e.known() ? absl::StrFormat("[%.6f, %.6f]", e.lo, e.hi) : std::string("null"), e.n,
      budget));
}

}  // namespace freeride
