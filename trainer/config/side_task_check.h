// Side-task validation that `config check` and `train` share: stages within the pipeline,
// memory limits within what each stage leaves to side work, one server per port, and each task
// built as `train` builds it (type or plugin found with the right ABI, arguments accepted by its
// Create), in a worker process where its isolation says so. Errors name the config file and line.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "freeride/task_host.h"
#include "trainer/config/config.h"

namespace freeride {

// The executor's spec of side_tasks[index].
SideTaskSpec SpecOf(const SideTaskConfig& task);

// What a stage leaves to side work by the run's memory plan (trainer/rank_memory.h), and how.
struct SideRoom {
  int64_t bytes = 0;
  std::string how;  // "runtime.memory_fraction 0.90 × 5.88 GiB − training's planned peak ..."
};

// Stages and memory limits of every task, and serve tasks' ports (no two servers on one port,
// counting each rank a task runs on); cheap: no task is built. One line per problem. A task's
// memory_limit must fit the room of each stage it runs on (`rooms`, one per stage), or, without
// rooms, the memory the host has free.
absl::Status CheckSideTaskPlacement(const Config& config, const std::vector<SideRoom>& rooms = {});

// CheckSideTaskPlacement, then every task created (and released) as training would create it.
// Errors: one line per problem, each "file:line:column: side_tasks[i] ('name', type): ...".
// A task that crashes or hangs while being created is not an error of the config (training
// would mark it FAILED and go on): it is returned in `warnings`. `classes`, when given, gets
// each task's class as its host says once created (SideTaskClassName; "" where it was not).
absl::Status ValidateSideTasks(const Config& config, std::vector<std::string>* warnings,
                               std::vector<std::string>* classes = nullptr,
                               const std::vector<SideRoom>& rooms = {});

}  // namespace freeride
