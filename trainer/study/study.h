// `freeride study`: in one run, training alone against training with each configured side task
// and with all of them, in blocks of steps, and a table of what each arm costs and yields with
// 95% confidence intervals: overhead, utilisation, reclaimed; overrun and side-task throughput
// in bubbles against alone.
//
// The pattern: a warm-up (two steps to place and measure the bubbles, then one block of each
// task arm so every task has started; none of it counted), a plain block (training alone), then
// per round every arm once in an order shuffled with run.seed, each arm block followed by a
// plain block. Each arm block is compared with the plain blocks on either side of it
// (trainer/study_stats.h). An A/A arm — training alone, measured exactly like a task arm — is
// in every study: its interval is the machine's noise floor. With a target, rounds are added
// until every arm's overhead interval is within ±target or max_rounds is reached.
//
// It says how far it is after every block (PROGRESS lines: round, arm, elapsed, an estimate of
// the time left from the steps done), saves each round's blocks as it completes it, and, when
// stopped by a signal, writes the report of the rounds it completed, marked partial;
// `resume` continues from the saved rounds, the report covering all of them.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "trainer/config/config.h"
#include "trainer/trainer.h"

namespace freeride {

struct StudyOptions {
  int rounds = 3;         // rounds always run
  int block_steps = 4;    // steps per block
  double target_ci = 0;   // > 0: add rounds until every overhead interval is within ±target_ci
                          // (a fraction: 0.02 is ±2%)
  int max_rounds = 20;    // with a target: at most this many rounds in all
  bool resume = false;    // go on from the rounds saved in run.dir (study_blocks.h)
};

// The rounds the study may run: max_rounds with a target, else rounds.
int StudyRoundsAtMost(const StudyOptions& options);

// Steps a study may need (its longest run): warm-up, then every block of every round.
int64_t StudySteps(const Config& config, const StudyOptions& options);

// What a study sets in the config it runs: its own directory, run.dir/study (checkpoint.dir
// stays the run's), the steps, no alternation or evaluation of its own, and repeat = true for
// every task that does not say otherwise (an arm whose task ran out of work would measure
// nothing).
void PrepareStudyConfig(Config& config, const StudyOptions& options);

// OK when the config has side tasks to compare (freeride.enabled and [[side_tasks]]); checked
// before the run directory is created.
absl::Status CheckStudyConfig(const Config& config);

// Runs the study on `trainer` (every rank calls it); rank 0 writes run.dir/study.md and
// run.dir/study.json and returns the Markdown (other ranks an empty string). Stopped by a
// signal: Cancelled, saying what was written (the partial report) and how to go on.
absl::StatusOr<std::string> RunStudy(Trainer& trainer, const Config& config,
                                     const StudyOptions& options);

}  // namespace freeride
