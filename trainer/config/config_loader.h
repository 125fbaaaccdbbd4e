// The config loader's insides, shared by config.cc (TOML and --set read into a Config, each key
// checked) and config_rules.cc (the rules between keys). Not the config's interface: that is
// config.h.
#pragma once

#include <toml++/toml.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "trainer/config/config.h"
#include "trainer/config/config_schema.h"

namespace freeride::config_internal {

struct Origin {
  std::string source;
  int64_t line = 0;  // 0: no line (a --set override, or a key left at its default)
  int64_t column = 0;
  std::string Where() const {
    return line > 0 ? absl::StrCat(source, ":", line, ":", column) : source;
  }
};

class Loader {
 public:
  explicit Loader(absl::string_view source) : source_(source) {}

  void LoadDocument(const toml::table& root);
  void ApplyOverride(const std::string& assignment);
  void CheckRequired();
  // The rules between keys (config_rules.cc), each skipped where a key it reads has an error of
  // its own (that key then holds its default, not what was written); with `check_files`, that
  // data.train and data.val name files.
  void CheckCrossField(bool check_files = false);
  // What origins_ says of side_tasks[index]'s keys, relative to the task ("args.x", "type").
  std::map<std::string, std::string> SideTaskOrigins(size_t index) const {
    const std::string prefix = absl::StrCat("side_tasks[", index, "]");
    std::map<std::string, std::string> out;
    for (auto it = origins_.lower_bound(prefix); it != origins_.end(); ++it) {
      if (it->first.rfind(prefix, 0) != 0) break;
      std::string rest = it->first.substr(prefix.size());
      if (!rest.empty() && rest[0] != '.') continue;  // side_tasks[1] is not side_tasks[10]
      out[rest.empty() ? "" : rest.substr(1)] = it->second.Where();
    }
    return out;
  }

  Config config;
  std::vector<std::string> errors;

 private:
  Origin At(const toml::source_region& region) const {
    return Origin{source_, static_cast<int64_t>(region.begin.line),
                  static_cast<int64_t>(region.begin.column)};
  }
  Origin OriginOf(const std::string& key) const {
    auto it = origins_.find(key);
    return it != origins_.end() ? it->second : Origin{source_};
  }
  void Error(const Origin& origin, absl::string_view key, absl::string_view message) {
    errors.push_back(absl::StrCat(origin.Where(), ": ", key, ": ", message));
    failed_.insert(std::string(key));
  }
  void Mismatch(const Origin& origin, absl::string_view key, absl::string_view expected,
                absl::string_view found) {
    Error(origin, key, absl::StrCat("expected ", expected, ", found ", found));
  }
  void SetKey(const KeySpec& spec, const toml::node& node, const Origin& origin);
  void LoadSideTask(size_t index, const toml::table& table);
  void SetSideTaskKey(size_t index, absl::string_view key, const toml::node& node,
                      const Origin& origin);
  void SetArg(size_t index, absl::string_view name, const toml::node& node, const Origin& origin);

  std::string source_;
  std::map<std::string, Origin> origins_;
  std::set<std::string> failed_;  // keys with an error of their own
};

}  // namespace freeride::config_internal
