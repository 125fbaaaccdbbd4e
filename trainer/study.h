// `freeride study`: in one run, training alone against training with each configured side task
// and with all of them, in alternating blocks of steps (so slow drifts of the machine hit every
// arm alike), and a table of what each arm costs and yields: overhead, utilisation, overrun,
// reclaimed, side-task throughput in bubbles against alone.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "trainer/config.h"
#include "trainer/trainer.h"

namespace freeride {

struct StudyOptions {
  int rounds = 3;       // each arm's block comes this many times
  int block_steps = 4;  // steps per block
};

// Steps a study needs: two warm-up steps (bubbles placed, then measured) and the blocks.
int64_t StudySteps(const Config& config, const StudyOptions& options);

// Runs the study on `trainer` (every rank calls it); rank 0 writes run.dir/study.md and
// run.dir/study.json and returns the Markdown (other ranks an empty string).
absl::StatusOr<std::string> RunStudy(Trainer& trainer, const Config& config,
                                     const StudyOptions& options);

}  // namespace freeride
