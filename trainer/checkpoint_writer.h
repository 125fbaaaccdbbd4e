// checkpoint.background: a checkpoint's files written by a thread of their own, from a snapshot
// the step boundary took, while training goes on. One is in flight at a time: the next
// checkpoint (and a stop's or the run's end) waits for it first, on every rank alike, so the
// ranks' collectives stay in step. A write counts as in flight for core/stop_request.h from
// Start until the checkpoint is whole: a second stop signal meanwhile waits for it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

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

// Waits until every file of `names` (the stages' state files, ZeRO-1's moment shares) is in
// the staging directory `staging` (the leader of a background checkpoint, before its
// manifest): each is renamed into place when complete. A rank whose write failed leaves the
// file's FailedFileName there. Gives up after `timeout_s`.
absl::Status WaitForStateFiles(const std::string& staging, const std::vector<std::string>& names,
                               double timeout_s);

// The file a rank whose state file `name` (name.bin) could not be written leaves beside it
// (name.failed), so that the leader stops waiting for it.
std::string FailedFileName(const std::string& name);

// A rank that writes no manifest: waits until the checkpoint of `step` in `dir` is whole
// (renamed into place and named by `latest`) or abandoned (its staging directory gone and no
// step directory), or `timeout_s` passes.
void WaitForCheckpointEnd(const std::string& dir, int64_t step, double timeout_s);

// Tests only: FREERIDE_TEST_HOLD_CHECKPOINT=N holds the write of the checkpoint of step N, once
// this rank's state file is in its staging directory, until the file `release` appears there
// (or the process is killed); it first creates `held_rNNN` there, so a test knows the write is
// under way (kill it mid-write, see that training went on, send signals) without guessing at
// timing. FREERIDE_TEST_SLOW_CHECKPOINT_S=S makes every state file's write take S seconds more
// (at most 60), so that a test finds a background checkpoint in flight whenever it looks.
void HoldIfTestAsks(const std::string& staging, int64_t step, int stage);

}  // namespace freeride
