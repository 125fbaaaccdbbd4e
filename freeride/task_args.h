// A side task's own arguments (`[side_tasks.args]` in the config): scalars or arrays of one
// scalar type, read by the task with typed getters whose errors name the task and argument.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"

namespace freeride {

using ArgValue = std::variant<bool, int64_t, double, std::string, std::vector<int64_t>,
                              std::vector<double>, std::vector<std::string>>;
using TaskArgs = std::map<std::string, ArgValue>;

// Typed access for a task named `task`. A missing argument gives the fallback; a present one
// of the wrong type or out of range is an error: "side task 'pr': args.damping: expected a
// number in [0, 1], found "high"".
class ArgReader {
 public:
  ArgReader(std::string task, const TaskArgs& args) : task_(std::move(task)), args_(args) {}

  absl::StatusOr<int64_t> Int(const std::string& name, int64_t fallback, int64_t min,
                              int64_t max) const;
  absl::StatusOr<double> Number(const std::string& name, double fallback, double min,
                                double max) const;
  absl::StatusOr<std::string> String(const std::string& name, const std::string& fallback) const;
  absl::StatusOr<bool> Bool(const std::string& name, bool fallback) const;
  absl::StatusOr<std::vector<std::string>> Strings(const std::string& name) const;
  // A string that must be one of `choices`.
  absl::StatusOr<std::string> Choice(const std::string& name, const std::string& fallback,
                                     const std::vector<std::string>& choices) const;
  // Every argument given must be one of `known`; else an error listing them.
  absl::Status OnlyKnown(const std::vector<std::string>& known) const;

 private:
  absl::Status Error(const std::string& name, const std::string& expected) const;

  std::string task_;
  const TaskArgs& args_;
};

std::string DescribeArg(const ArgValue& value);

}  // namespace freeride
