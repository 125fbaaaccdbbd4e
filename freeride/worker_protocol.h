// The messages between a rank and its side-task worker: one datagram each on a SOCK_SEQPACKET
// socket pair, fields separated by the ASCII unit separator, the first field naming the
// message. The rank asks (spec, create, load, step, finish); the worker answers each with
// `ok …` or `error <reason>`. The task's spec travels as TOML.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "freeride/task_host.h"

namespace freeride {

struct WorkerSpec {
  SideTaskSpec task;
  int rank = 0, stage = 0;
  std::string results_dir;
};

std::string EncodeWorkerSpec(const WorkerSpec& spec);
absl::StatusOr<WorkerSpec> DecodeWorkerSpec(absl::string_view text);

using Message = std::vector<std::string>;
absl::Status SendMessage(int fd, const Message& message);
// Blocking. The other side gone: Unavailable.
absl::StatusOr<Message> ReceiveMessage(int fd);

}  // namespace freeride
