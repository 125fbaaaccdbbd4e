// One training step: the schedule run by the executor, the step's figures agreed by every
// rank, and the optimizer's end of it. With optim.step_sync = "post_validate" the step ends
// without a barrier: each rank steps speculatively once its own gradients are summed (keeping
// its parameters and AdamW moments), runs the next step's first forwards while the global
// state is summed, and then confirms the step, or rolls it back and redoes it the way the
// barrier would have: clipped, or not at all when not finite. Either way the same bits.
#include <algorithm>
#include <cmath>
#include <map>

#include "core/stop_request.h"
#include "trainer/jobs/job_runner.h"
#include "trainer/optimizer.h"
#include "trainer/run_metrics.h"
#include "trainer/trainer.h"

namespace freeride {

absl::StatusOr<StepExchange> Trainer::StepSums(const pipeline::StepOutcome& outcome,
                                               std::map<int, double>* predicted_here) {
  // With side tasks, every stage's bubbles of the step ride on it: one entry per BUBBLE of the
  // schedule (every rank knows it), filled in by the rank that ran it.
  const std::vector<std::pair<int, int>>& slots = bubble_slots_;
  StepExchange e = StepExchange::Shaped(layout_.pp, slots.size(),
                                        jobs_ ? jobs_->exchange_size() : 0, guard_ != nullptr);
  if (layout_.replica == 0) {
    StepExchange::Stage& own = e.stages[layout_.stage];
    own.bubble_s = outcome.bubble_s;
    own.host_peak_bytes = static_cast<double>(PeakRssBytes());
    for (const auto& chunk : chunks_) own.device_bytes += static_cast<double>(chunk->DeviceBytes());
  }
  e.stop_requests = StopRequestedBy() != 0 ? 1 : 0;
  if (side_) {
    for (const BubbleRecord& r : side_->TakeBubbleRecords()) {
      if (r.predicted_s > 0) (*predicted_here)[r.index] = r.predicted_s * 1e3;
      const auto it =
          std::lower_bound(slots.begin(), slots.end(), std::pair<int, int>{layout_.stage, r.index});
      if (layout_.replica != 0 || it == slots.end() || *it != std::pair{layout_.stage, r.index}) {
        continue;
      }
      e.bubbles[it - slots.begin()] = {true, r.predicted_s, r.measured_s, r.harvested_s};
    }
  }
  // Fill jobs ride on it as well: an offer, cancellations, their progress.
  if (jobs_) {
    if (absl::Status s = jobs_->Fill(step_, e.jobs.data()); !s.ok()) return s;
  }
  // The step's time: summed, it gives every rank the same mean for the overhead guard.
  if (guard_) e.step_s_sum = outcome.step_s;
  return e;
}

absl::Status Trainer::FinishStep(const pipeline::StepOutcome& outcome, const StepExchange& summed,
                                 bool harvesting, std::map<int, double> predicted_here,
                                 StepStats* stats) {
  const std::vector<std::pair<int, int>>& slots = bubble_slots_;
  if (jobs_) {
    if (absl::Status s = jobs_->Apply(stats->step, summed.jobs.data()); !s.ok()) return s;
  }
  if (guard_) {
    ObserveOverhead(stats->step - 1,
                    summed.step_s_sum.value_or(0) / static_cast<double>(transport_->size()));
  }
  stats->stop_requested = summed.stop_requests > 0;
  for (const StepExchange::Stage& st : summed.stages) {
    stats->bubble_s.push_back(st.bubble_s);
    stats->host_peak_bytes.push_back(st.host_peak_bytes);
    stats->device_bytes.push_back(st.device_bytes);
  }
  for (size_t k = 0; k < slots.size(); ++k) {
    const StepExchange::Bubble& b = summed.bubbles[k];
    if (!b.ran) continue;
    const auto [stage, index] = slots[k];
    const std::vector<pipeline::Instr>& instrs = executor_->schedule().per_stage[stage];
    stats->bubbles.push_back({stage, index, instrs[index].bubble, b.predicted_s, b.measured_s,
                              b.harvested_s, pipeline::BubbleKeys(instrs)[index].anchor});
  }
  last_timeline_ = outcome.timeline;
  last_step_start_s_ = outcome.start_s;
  if (stats->step == 1 && layout_.pp > 1) {
    if (absl::Status s = PlaceBubblesFromMeasuredCosts(outcome.timeline); !s.ok()) return s;
  }
  if (stats->step >= config_.trace.steps[0] && stats->step <= config_.trace.steps[1]) {
    timelines_.emplace_back(stats->step, outcome.timeline);
    timeline_starts_.push_back(outcome.start_s);
    timeline_harvested_.push_back(side_ != nullptr && harvesting);
    timeline_bubble_s_.push_back(outcome.bubble_s);
    timeline_predicted_.push_back(std::move(predicted_here));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepStats> Trainer::Step() {
  const TrainConfig& tc = config_.train;
  const bool post = config_.optim.step_sync == "post_validate";
  // A step that ran ahead (kept, or rolled back to run anew) has its batch loaded already.
  if (!next_batch_loaded_) train_->Next(inputs_.data(), targets_.data());
  next_batch_loaded_ = false;
  const float loss_scale = 1.0f / static_cast<float>(tc.batch_size * layout_.dp * tc.seq_len);
  // Alternating blocks (freeride.alternate_every, or the overhead guard's cycles) give the
  // overhead within one run.
  const auto harvesting_in = [this](int64_t step) { return HarvestingStep(step); };
  const bool harvesting = harvesting_in(step_);
  if (side_) side_->set_harvesting(harvesting);
  // Each compute instruction waits for the device only where its timeline is used: a
  // pipeline's (bubbles are placed from it), a traced step's. One stage's other steps then
  // queue a whole step's work with a few waits (bench/README.md's ledger).
  const auto exact_timeline = [&](int64_t step) {
    return layout_.pp > 1 || (step >= config_.trace.steps[0] && step <= config_.trace.steps[1]);
  };
  executor_->set_exact_timeline(exact_timeline(step_ + 1));
  absl::StatusOr<pipeline::StepOutcome> outcome = executor_->RunStep(Microbatches(), loss_scale);
  if (!outcome.ok()) return outcome.status();
  // The first step warms up: left out of the comparison. Under the guard a step counts with its
  // block, whatever the level (a paused harvesting block is still one of the pair).
  if (step_ > 0) {
    timed_steps_.emplace_back(guard_ ? guard_->Harvesting(step_) : harvesting, outcome->step_s);
  }
  StepStats stats;
  stats.step = ++step_;
  stats.harvesting = config_.freeride.enabled && harvesting;
  std::map<int, double> predicted_here;
  absl::StatusOr<StepExchange> exchange = StepSums(*outcome, &predicted_here);
  if (!exchange.ok()) return exchange.status();
  std::vector<double> sums = exchange->Pack();
  const double timeout = config_.runtime.comm_timeout_s;
  if (!post) {
    if (absl::Status s = transport_->AllReduceSum(sums.data(), static_cast<int64_t>(sums.size()),
                                                  transport_->AllRanks(), timeout);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = exchange->Unpack(sums); !s.ok()) return s;
    stats.loss = outcome->loss;
  } else {
    // The step's figures are summed while the next step's first forwards run, which the
    // validation keeps or undoes.
    absl::StatusOr<pipeline::Transport::Request> summing = transport_->StartAllReduceSum(
        sums.data(), static_cast<int64_t>(sums.size()), transport_->AllRanks());
    if (!summing.ok()) return summing.status();
    const LoaderPosition before = train_->position();
    const bool ahead = RunsAhead();
    if (ahead) {
      train_->Next(inputs_.data(), targets_.data());
      if (side_) side_->set_harvesting(harvesting_in(step_));
      executor_->set_exact_timeline(exact_timeline(step_ + 1));
      if (absl::Status s = executor_->RunAhead(Microbatches(), loss_scale); !s.ok()) return s;
    }
    absl::StatusOr<pipeline::StepState> state = executor_->AwaitState();
    if (!state.ok()) return state.status();
    if (absl::Status s = transport_->Wait(*summing, timeout); !s.ok()) return s;
    if (absl::Status s = exchange->Unpack(sums); !s.ok()) return s;
    absl::StatusOr<bool> confirmed = Validate(*state);
    if (!confirmed.ok()) return confirmed.status();
    stats.loss = state->loss;
    // The next step's batch is loaded, unless a stop comes first: it goes back for the
    // checkpoint to resume from. After a rollback the next step runs anew on it.
    const bool stop = exchange->stop_requests > 0;
    next_batch_loaded_ = ahead && !stop;
    if (ahead && (!*confirmed || stop)) {
      if (absl::Status s = executor_->DiscardAhead(); !s.ok()) return s;
      if (stop) train_->Seek(before);
    }
  }
  stats.lr = last_lr_;
  stats.grad_norm = last_grad_norm_;
  stats.step_s = outcome->step_s;
  stats.tokens_per_s =
      static_cast<double>(tc.batch_size * layout_.dp * tc.seq_len) / outcome->step_s;
  stats.applied = last_applied_;
  if (absl::Status s =
          FinishStep(*outcome, *exchange, harvesting, std::move(predicted_here), &stats);
      !s.ok()) {
    return s;
  }
  // ZeRO-1: the run ends after this step (its last, or a stop): its parameters whole now.
  if (step_ >= config_.train.steps || stats.stop_requested) {
    if (absl::Status s = CompleteParams(); !s.ok()) return s;
  }
  return stats;
}

bool Trainer::RunsAhead() const {
  // Not after the first step (its end places the bubbles anew: the instructions move), nor
  // into a step that comes after an evaluation or a checkpoint (they need this step's weights
  // and the data loader where this step left it), nor past the last.
  const int64_t k = step_;  // the step just run, 1-based
  const auto at = [k](int64_t every) { return every > 0 && k % every == 0; };
  return k > 1 && k < config_.train.steps && !(val_ && at(config_.eval.every)) &&
         !(!config_.runtime.emulate_peers && at(config_.checkpoint.every));
}

absl::Status Trainer::ApplyUpdate(int64_t step, double grad_scale) {
  AdamWStep adam;
  adam.lr = last_lr_;
  adam.beta1 = config_.optim.beta1;
  adam.beta2 = config_.optim.beta2;
  adam.eps = config_.optim.eps;
  adam.weight_decay = config_.optim.weight_decay;
  adam.step = step;
  adam.grad_scale = grad_scale;
  for (const auto& chunk : chunks_) {
    if (absl::Status s = chunk->ApplyAdamW(adam); !s.ok()) return s;
  }
  // ZeRO-1: each rank stepped its share; every rank of the data-parallel group starts the
  // all-gather of the parameters here alike (the decision to step is global). The next step's
  // first forward of each chunk waits for the chunk's (CompleteParams before anything else
  // reads them).
  return executor_->zero() ? executor_->StartZeroGather() : absl::OkStatus();
}

bool Trainer::WillSpeculate(const std::vector<double>& own, bool loss_finite) const {
  // What this rank knows already: a non-finite loss or units, or its own share of the norm
  // over the clip, make the barrier's step differ from an unclipped one.
  double squares = 0;
  for (double u : own) squares += u;
  return loss_finite && std::isfinite(squares) &&
         ClipScale(std::sqrt(squares), config_.optim.grad_clip) == 1.0;
}

absl::Status Trainer::KeepBackup() {
  if (absl::Status s = CompleteParams(); !s.ok()) return s;
  backup_.resize(chunks_.size());
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const int64_t n = chunks_[c]->num_params();
    const int64_t held = chunks_[c]->OptimizerStateElements();  // a ZeRO-1 share: its own
    Backup& b = backup_[c];
    b.params.resize(n), b.m.resize(held), b.v.resize(held);
    if (absl::Status s = chunks_[c]->GetParams(b.params.data()); !s.ok()) return s;
    if (absl::Status s = chunks_[c]->GetOptimizerState(b.m.data(), b.v.data()); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Trainer::Speculate() {
  last_lr_ = LearningRate(config_.optim, step_, config_.train.steps);
  speculated_ = true;
  return ApplyUpdate(step_ + 1, 1.0);
}

absl::StatusOr<bool> Trainer::Validate(const pipeline::StepState& state) {
  // The barrier's decision (OptimizerStep) from the same sums: step_ already counts the step.
  double squares = 0;
  for (double u : state.units) squares += u;
  last_grad_norm_ = std::sqrt(squares);
  last_lr_ = LearningRate(config_.optim, step_ - 1, config_.train.steps);
  last_applied_ = state.loss_finite && std::isfinite(last_grad_norm_);
  const double scale = ClipScale(last_grad_norm_, config_.optim.grad_clip);
  const bool speculated = speculated_;
  speculated_ = false;
  if (last_applied_ && scale == 1.0 && state.all_speculated) return true;
  if (speculated) {
    // The speculative step's gather may still be on its way to chunks that have not run a
    // forward since: it lands before the backup does, not after.
    if (absl::Status s = CompleteParams(); !s.ok()) return s;
    for (size_t c = 0; c < chunks_.size(); ++c) {
      const Backup& b = backup_[c];
      if (absl::Status s = chunks_[c]->SetParams(b.params.data()); !s.ok()) return s;
      if (absl::Status s = chunks_[c]->SetOptimizerState(b.m.data(), b.v.data()); !s.ok()) {
        return s;
      }
    }
  }
  if (last_applied_) {
    if (absl::Status s = ApplyUpdate(step_, scale); !s.ok()) return s;
  }
  return false;
}

}  // namespace freeride
