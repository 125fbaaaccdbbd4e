#include "freeride/task_args.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace freeride {

std::string DescribeArg(const ArgValue& value) {
  if (const bool* b = std::get_if<bool>(&value)) return *b ? "true" : "false";
  if (const int64_t* i = std::get_if<int64_t>(&value)) return absl::StrFormat("%d", *i);
  if (const double* d = std::get_if<double>(&value)) return absl::StrFormat("%g", *d);
  if (const std::string* s = std::get_if<std::string>(&value)) {
    return absl::StrFormat("\"%s\"", *s);
  }
  return "an array";
}

absl::Status ArgReader::Error(const std::string& name, const std::string& expected) const {
  return absl::InvalidArgumentError(absl::StrFormat(
      "side task '%s': args.%s: expected %s, found %s", task_, name, expected,
      DescribeArg(args_.at(name))));
}

absl::StatusOr<int64_t> ArgReader::Int(const std::string& name, int64_t fallback, int64_t min,
                                       int64_t max) const {
  auto it = args_.find(name);
  if (it == args_.end()) return fallback;
  const int64_t* v = std::get_if<int64_t>(&it->second);
  if (v == nullptr || *v < min || *v > max) {
    return Error(name, absl::StrFormat("an integer in [%d, %d]", min, max));
  }
  return *v;
}

absl::StatusOr<double> ArgReader::Number(const std::string& name, double fallback, double min,
                                         double max) const {
  auto it = args_.find(name);
  if (it == args_.end()) return fallback;
  double v;
  if (const double* d = std::get_if<double>(&it->second)) {
    v = *d;
  } else if (const int64_t* i = std::get_if<int64_t>(&it->second)) {
    v = static_cast<double>(*i);
  } else {
    return Error(name, absl::StrFormat("a number in [%g, %g]", min, max));
  }
  if (v < min || v > max) return Error(name, absl::StrFormat("a number in [%g, %g]", min, max));
  return v;
}

absl::StatusOr<std::string> ArgReader::String(const std::string& name,
                                              const std::string& fallback) const {
  auto it = args_.find(name);
  if (it == args_.end()) return fallback;
  const std::string* s = std::get_if<std::string>(&it->second);
  if (s == nullptr) return Error(name, "a string");
  return *s;
}

absl::StatusOr<bool> ArgReader::Bool(const std::string& name, bool fallback) const {
  auto it = args_.find(name);
  if (it == args_.end()) return fallback;
  const bool* b = std::get_if<bool>(&it->second);
  if (b == nullptr) return Error(name, "true or false");
  return *b;
}

absl::StatusOr<std::string> ArgReader::Choice(const std::string& name,
                                              const std::string& fallback,
                                              const std::vector<std::string>& choices) const {
  absl::StatusOr<std::string> s = String(name, fallback);
  if (!s.ok() || std::find(choices.begin(), choices.end(), *s) != choices.end()) return s;
  return Error(name, absl::StrCat("one of \"", absl::StrJoin(choices, "\", \""), "\""));
}

absl::StatusOr<std::vector<std::string>> ArgReader::Strings(const std::string& name) const {
  auto it = args_.find(name);
  if (it == args_.end()) return std::vector<std::string>{};
  if (const auto* list = std::get_if<std::vector<std::string>>(&it->second)) return *list;
  if (const auto* s = std::get_if<std::string>(&it->second)) return std::vector<std::string>{*s};
  return Error(name, "a string or an array of strings");
}

absl::Status ArgReader::OnlyKnown(const std::vector<std::string>& known) const {
  for (const auto& [name, value] : args_) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "side task '%s': unknown argument args.%s; it takes: %s", task_, name,
          known.empty() ? "none" : absl::StrJoin(known, ", ")));
    }
  }
  return absl::OkStatus();
}

}  // namespace freeride
