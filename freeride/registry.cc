#include <dlfcn.h>

#include <map>
#include <mutex>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "freeride/side_task.h"

namespace freeride {
namespace {

std::map<std::string, SideTaskFactory>& Registry() {
  static auto* registry = new std::map<std::string, SideTaskFactory>();
  return *registry;
}

}  // namespace

const char* TaskStateName(TaskState state) {
  switch (state) {
    case TaskState::kSubmitted: return "SUBMITTED";
    case TaskState::kCreated: return "CREATED";
    case TaskState::kLoaded: return "LOADED";
    case TaskState::kRunning: return "RUNNING";
    case TaskState::kFinished: return "FINISHED";
    case TaskState::kFailed: return "FAILED";
    case TaskState::kStopped: return "STOPPED";
  }
  return "?";
}

bool RegisterSideTask(const std::string& type, SideTaskFactory factory) {
  Registry()[type] = std::move(factory);
  return true;
}

std::vector<std::string> RegisteredSideTasks() {
  std::vector<std::string> names;
  for (const auto& [name, factory] : Registry()) names.push_back(name);
  return names;
}

absl::StatusOr<std::unique_ptr<SideTask>> CreateSideTask(const std::string& type,
                                                         const std::string& plugin) {
  if (plugin.empty()) {
    auto it = Registry().find(type);
    if (it == Registry().end()) {
      return absl::NotFoundError(absl::StrFormat(
          "unknown side task type '%s'; built-in types: %s (or name a plugin)", type,
          absl::StrJoin(RegisteredSideTasks(), ", ")));
    }
    return it->second();
  }
  // Plugins stay loaded for the life of the process (their code backs live tasks).
  void* handle = dlopen(plugin.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return absl::NotFoundError(
        absl::StrFormat("side task plugin %s cannot be loaded: %s", plugin, dlerror()));
  }
  using VersionFn = int (*)();
  using CreateFn = SideTask* (*)(const char*);
  auto version = reinterpret_cast<VersionFn>(dlsym(handle, "freeride_side_task_abi_version"));
  auto create = reinterpret_cast<CreateFn>(dlsym(handle, "freeride_create_side_task"));
  for (auto [fn, symbol] : {std::pair{reinterpret_cast<void*>(version),
                                      "freeride_side_task_abi_version"},
                            std::pair{reinterpret_cast<void*>(create), "freeride_create_side_task"}}) {
    if (fn == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "side task plugin %s lacks the symbol %s (define FREERIDE_SIDE_TASK_PLUGIN(Type, "
          "\"name\") in it)",
          plugin, symbol));
    }
  }
  if (version() != kSideTaskAbiVersion) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "side task plugin %s was built for side-task ABI version %d; this freeride has version "
        "%d: rebuild the plugin",
        plugin, version(), kSideTaskAbiVersion));
  }
  using IdentityFn = const char* (*)();
  auto identity = reinterpret_cast<IdentityFn>(dlsym(handle, "freeride_side_task_build_identity"));
  if (identity == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "side task plugin %s lacks the symbol freeride_side_task_build_identity (define "
        "FREERIDE_SIDE_TASK_PLUGIN(Type, \"name\") in it)",
        plugin));
  }
  if (std::string(identity()) != FREERIDE_SIDE_TASK_BUILD_IDENTITY) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "side task plugin %s was built with %s; this freeride was built with %s: "
        "std::string, std::function and absl::Status cross between them, so rebuild the plugin "
        "with this freeride's compiler and abseil (docs/side_tasks.md: find_package(freeride))",
        plugin, identity(), FREERIDE_SIDE_TASK_BUILD_IDENTITY));
  }
  SideTask* task = create(type.c_str());
  if (task == nullptr) {
    return absl::NotFoundError(
        absl::StrFormat("side task plugin %s does not provide type '%s'", plugin, type));
  }
  return std::unique_ptr<SideTask>(task);
}

}  // namespace freeride
