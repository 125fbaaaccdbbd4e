#include "trainer/checkpoint_writer.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "core/stop_request.h"
#include "core/files.h"
#include "trainer/train_state.h"

namespace freeride {

void CheckpointWriter::Start(std::function<absl::Status()> write) {
  done_ = false;
  BeginCheckpointWrite();
  thread_ = std::thread([this, write = std::move(write)] {
    status_ = write();
    done_ = true;
    EndCheckpointWrite();  // exits here if a second stop signal came meanwhile
  });
}

absl::Status CheckpointWriter::Wait() {
  if (!thread_.joinable()) return absl::OkStatus();
  thread_.join();
  absl::Status s = status_;
  status_ = absl::OkStatus();
  return s;
}

std::string FailedFileName(const std::string& name) {
  return std::string(absl::StripSuffix(name, ".bin")) + ".failed";
}

absl::Status WaitForStateFiles(const std::string& staging, const std::vector<std::string>& names,
                               double timeout_s) {
  namespace fs = std::filesystem;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (const std::string& name : names) {
    const fs::path file = fs::path(staging) / name;
    const fs::path failed = fs::path(staging) / FailedFileName(name);
    while (!fs::exists(file)) {
      if (fs::exists(failed)) {
        return absl::InternalError(absl::StrFormat(
            "checkpoint %s: %s could not be written (its rank's log says why)", staging, name));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrFormat("checkpoint %s: %s did not appear within %.0f s "
                            "(runtime.comm_timeout_s)",
                            staging, name, timeout_s));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return absl::OkStatus();
}

void WaitForCheckpointEnd(const std::string& dir, int64_t step, double timeout_s) {
  namespace fs = std::filesystem;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  const std::string staging = CheckpointStagingDir(dir, step);
  const fs::path final_dir = fs::path(dir) / CheckpointDirName(step);
  while (std::chrono::steady_clock::now() < deadline) {
    std::error_code ec;
    if (!fs::exists(staging, ec)) {
      // Renamed into place: whole once `latest` names it. Gone without a trace: abandoned.
      absl::StatusOr<std::string> latest = ReadFile((fs::path(dir) / "latest").string());
      if (!fs::exists(final_dir, ec) ||
          (latest.ok() && absl::StripAsciiWhitespace(*latest) == CheckpointDirName(step))) {
        return;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void HoldIfTestAsks(const std::string& staging, int64_t step, int stage) {
  const std::filesystem::path dir(staging);
  double slow_s = 0;
  if (const char* slow = std::getenv("FREERIDE_TEST_SLOW_CHECKPOINT_S");
      slow != nullptr && absl::SimpleAtod(slow, &slow_s) && slow_s > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(slow_s, 60.0)));
  }
  const char* value = std::getenv("FREERIDE_TEST_HOLD_CHECKPOINT");
  int64_t hold = 0;
  if (value == nullptr || !absl::SimpleAtoi(value, &hold) || hold != step) return;
  WriteFileAtomically((dir / absl::StrFormat("held_r%03d", stage)).string(), "").IgnoreError();
  std::error_code ec;
  while (!std::filesystem::exists(dir / "release", ec)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace freeride
