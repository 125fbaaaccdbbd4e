#include "trainer/checkpoint_writer.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "core/files.h"
#include "trainer/train_state.h"

namespace freeride {

void CheckpointWriter::Start(std::function<absl::Status()> write) {
  done_ = false;
  thread_ = std::thread([this, write = std::move(write)] {
    status_ = write();
    done_ = true;
  });
}

absl::Status CheckpointWriter::Wait() {
  if (!thread_.joinable()) return absl::OkStatus();
  thread_.join();
  absl::Status s = status_;
  status_ = absl::OkStatus();
  return s;
}

std::string FailedStateFileName(int stage) { return absl::StrFormat("state_r%03d.failed", stage); }

absl::Status WaitForStateFiles(const std::string& staging, int64_t pp, double timeout_s) {
  namespace fs = std::filesystem;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (int64_t stage = 0; stage < pp; ++stage) {
    const fs::path file = fs::path(staging) / RankStateFileName(static_cast<int>(stage));
    const fs::path failed = fs::path(staging) / FailedStateFileName(static_cast<int>(stage));
    while (!fs::exists(file)) {
      if (fs::exists(failed)) {
        return absl::InternalError(
            absl::StrFormat("checkpoint %s: stage %d could not write its state (its log says why)",
                            staging, stage));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrFormat("checkpoint %s: stage %d's state file did not appear within %.0f s "
                            "(runtime.comm_timeout_s)",
                            staging, stage, timeout_s));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return absl::OkStatus();
}

void HoldIfTestAsks(const std::string& staging, int64_t step, int stage) {
  const char* value = std::getenv("FREERIDE_TEST_HOLD_CHECKPOINT");
  int64_t hold = 0;
  if (value == nullptr || !absl::SimpleAtoi(value, &hold) || hold != step) return;
  WriteFileAtomically(
      (std::filesystem::path(staging) / absl::StrFormat("held_r%03d", stage)).string(), "")
      .IgnoreError();
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace freeride
