#include "trainer/config/side_task_check.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/host_memory.h"
#include "freeride/tasks/serve_http.h"

namespace freeride {
namespace {

// Where a problem with `task` points: the argument, key or table the message is about.
std::string WhereOf(const SideTaskConfig& task, const std::string& message) {
  auto origin = [&](const std::string& key) -> std::string {
    auto it = task.origins.find(key);
    return it != task.origins.end() ? it->second : "";
  };
  for (const auto& [key, where] : task.origins) {
    if (key.rfind("args.", 0) == 0 && message.find(key + ":") != std::string::npos) return where;
  }
  if (message.find("plugin") != std::string::npos && !origin("plugin").empty()) {
    return origin("plugin");
  }
  if (message.find("unknown side task type") != std::string::npos && !origin("type").empty()) {
    return origin("type");
  }
  return origin("");
}

std::string Problem(const SideTaskConfig& task, size_t index, const std::string& where,
                    absl::string_view message) {
  return absl::StrFormat("%s%sside_tasks[%d] ('%s', %s): %s", where, where.empty() ? "" : ": ",
                         index, task.name.empty() ? task.type : task.name, task.type, message);
}

// Where side_tasks[i]'s `key` was set: "file:line:column", or the task's table when the key
// has its default.
std::string OriginOf(const SideTaskConfig& task, const std::string& key) {
  auto it = task.origins.find(key);
  if (it == task.origins.end()) it = task.origins.find("");
  return it != task.origins.end() ? it->second : "";
}

// Each built-in serve task's port is bound by every rank that runs it: two servers (two tasks,
// or one task on several ranks) on one port collide on a host they share. Which ranks share a
// host is not known before launch, so any two are refused here rather than left to fail to
// bind at run time; port = 0 takes any free port on each rank.
void CheckServePorts(const Config& config, std::vector<std::string>* problems) {
  const int64_t pp = config.parallel.pp, dp = config.parallel.dp;
  std::map<int64_t, size_t> first_on_port;
  for (size_t i = 0; i < config.side_tasks.size(); ++i) {
    const SideTaskConfig& task = config.side_tasks[i];
    if (task.type != "serve" || !task.plugin.empty()) continue;
    int64_t port = serve::kDefaultPort;
    const auto it = task.args.find("port");
    if (it != task.args.end()) {
      if (!std::holds_alternative<int64_t>(it->second)) continue;  // the task's Create says why
      port = std::get<int64_t>(it->second);
    }
    if (port == 0) continue;
    const std::string where = OriginOf(task, "args.port");
    const std::string port_text = absl::StrCat(port, it == task.args.end() ? " (the default)" : "");
    const int64_t stages = task.stages.empty() ? pp : static_cast<int64_t>(task.stages.size());
    if (stages * dp > 1) {
      problems->push_back(absl::StrFormat(
          "%s: side_tasks[%d].args.port = %s: the task runs on %d ranks (%d stage%s x "
          "parallel.dp = %d), each a server on this port, and ranks on one host cannot share "
          "one: give it one stage (stages = [0]) with dp = 1, or port = 0 (any free port, "
          "written to side_tasks/%s_r<rank>/address)",
          where, i, port_text, stages * dp, stages, stages == 1 ? "" : "s", dp, task.name));
    }
    auto [first, inserted] = first_on_port.emplace(port, i);
    if (!inserted) {
      const SideTaskConfig& other = config.side_tasks[first->second];
      problems->push_back(absl::StrFormat(
          "%s: side_tasks[%d].args.port = %s: side_tasks[%d] ('%s', %s) serves on this port "
          "too, and two servers on one host cannot share one: give each its own port, or "
          "port = 0 (any free port, written to side_tasks/<name>_r<rank>/address)",
          where, i, port_text, first->second, other.name, OriginOf(other, "args.port")));
    }
  }
}

int64_t FreeHostBytes() {
  return static_cast<int64_t>(sysconf(_SC_AVPHYS_PAGES)) *
         static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace

SideTaskSpec SpecOf(const SideTaskConfig& task) {
  SideTaskSpec spec;
  spec.type = task.type;
  spec.name = task.name.empty() ? task.type : task.name;
  spec.plugin = task.plugin;
  spec.priority = task.priority;
  spec.memory_limit_bytes = task.memory_limit_bytes;
  spec.args = task.args;
  spec.isolation = task.isolation.empty() ? DefaultIsolation(task) : task.isolation;
  spec.repeat = task.repeat.value_or(false);
  return spec;
}

absl::Status CheckSideTaskPlacement(const Config& config, const std::vector<SideRoom>& rooms) {
  std::vector<std::string> problems;
  const int64_t available = FreeHostBytes();
  for (size_t i = 0; i < config.side_tasks.size(); ++i) {
    const SideTaskConfig& task = config.side_tasks[i];
    for (int64_t stage : task.stages) {
      if (stage >= config.parallel.pp) {
        problems.push_back(absl::StrFormat(
            "side_tasks[%d].stages: stage %d, but parallel.pp = %d (stages 0..%d)", i, stage,
            config.parallel.pp, config.parallel.pp - 1));
        break;
      }
    }
    auto it = task.origins.find("memory_limit");
    const std::string where = it != task.origins.end() ? it->second + ": " : "";
    if (rooms.empty() && task.memory_limit_bytes > available) {
      problems.push_back(absl::StrFormat(
          "%sside_tasks[%d].memory_limit = %s is more than this stage has free (%s)", where, i,
          FormatByteSize(task.memory_limit_bytes), FormatByteSize(available)));
    }
    // By the plan: the stage it runs on with the least room.
    int64_t tightest = -1;
    for (int64_t stage = 0; stage < static_cast<int64_t>(rooms.size()); ++stage) {
      const bool here = task.stages.empty() || std::find(task.stages.begin(), task.stages.end(),
                                                         stage) != task.stages.end();
      if (here && (tightest < 0 || rooms[stage].bytes < rooms[tightest].bytes)) tightest = stage;
    }
    if (tightest >= 0 && task.memory_limit_bytes > rooms[tightest].bytes) {
      problems.push_back(absl::StrFormat(
          "%sside_tasks[%d].memory_limit = %s is more than stage %d leaves to side work: %s (%s)",
          where, i, FormatByteSize(task.memory_limit_bytes), tightest,
          FormatBytes(rooms[tightest].bytes), rooms[tightest].how));
    }
  }
  CheckServePorts(config, &problems);
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
}

absl::Status ValidateSideTasks(const Config& config, std::vector<std::string>* warnings,
                               std::vector<std::string>* classes,
                               const std::vector<SideRoom>& rooms) {
  if (absl::Status s = CheckSideTaskPlacement(config, rooms); !s.ok()) return s;
  std::string scratch = (std::filesystem::temp_directory_path() / "freeride-check-XXXXXX").string();
  if (mkdtemp(scratch.data()) == nullptr) {
    return absl::InternalError("config check: cannot make a scratch directory for side tasks");
  }
  std::vector<std::string> problems;
  for (size_t i = 0; i < config.side_tasks.size(); ++i) {
    const SideTaskConfig& task = config.side_tasks[i];
    HostOptions options;
    options.results_dir = (std::filesystem::path(scratch) / absl::StrCat(i)).string();
    options.step_timeout_s = config.freeride.step_timeout_s;
    std::error_code ec;
    std::filesystem::create_directories(options.results_dir, ec);
    absl::StatusOr<std::unique_ptr<TaskHost>> host = MakeTaskHost(SpecOf(task), options);
    absl::Status s = host.ok() ? (*host)->Create() : host.status();
    if (classes != nullptr) {
      classes->push_back(s.ok() ? SideTaskClassName((*host)->latency_sensitive()) : "");
    }
    if (host.ok()) (*host)->Release();
    if (s.ok()) continue;
    const std::string message(s.message());
    if (absl::IsUnavailable(s)) {
      warnings->push_back(Problem(task, i, WhereOf(task, message),
                                  absl::StrCat("create: ", message,
                                               " (training would mark it FAILED and go on)")));
    } else {
      problems.push_back(Problem(task, i, WhereOf(task, message), message));
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(scratch, ec);
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
}

}  // namespace freeride
