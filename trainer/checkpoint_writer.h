// checkpoint.background: a checkpoint's files written by a thread of their own, from a snapshot
// the step boundary took, while training goes on. One is in flight at a time: the next
// checkpoint (and a stop's or the run's end) waits for it first, on every rank alike, so the
// ranks' collectives stay in step.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "absl/status/status.h"

namespace freeride {

class CheckpointWriter {
 public:
  CheckpointWriter() = default;
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;
  // A run that ends early still finishes the checkpoint it started.
  ~CheckpointWriter() { Wait().IgnoreError(); }

  bool busy() const { return thread_.joinable(); }
  // Whether the write started last is still going (busy() and not yet done).
  bool writing() const { return thread_.joinable() && !done_; }
  // Runs `write` on the writer's thread; the caller has waited for the one before.
  void Start(std::function<absl::Status()> write);
  // Waits for the write in flight; its status (OK when none was).
  absl::Status Wait();

 private:
  std::thread thread_;
  std::atomic<bool> done_ = false;
  absl::Status status_;
};

// Waits until every stage's state file of `pp` is in the staging directory `staging` (the leader
// of a background checkpoint, before its manifest): each is renamed into place when complete.
// A stage whose write failed leaves `state_rNNN.failed` there. Gives up after `timeout_s`.
absl::Status WaitForStateFiles(const std::string& staging, int64_t pp, double timeout_s);

// The file a stage whose state file could not be written leaves beside it, so that the leader
// stops waiting for it.
std::string FailedStateFileName(int stage);

// Tests only: FREERIDE_TEST_HOLD_CHECKPOINT=N holds the write of the checkpoint of step N, once
// this rank's state file is in its staging directory, until the process is killed; it first
// creates `held_rNNN` there, so a test knows the write is under way (kill it mid-write, see
// that training went on) without guessing at timing.
void HoldIfTestAsks(const std::string& staging, int64_t step, int stage);

}  // namespace freeride
