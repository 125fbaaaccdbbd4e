// The typed schema behind Config: for every `section.key`, its type, allowed range or choices,
// whether it is required, its documentation, and where it lives in Config. Private to the
// config loader and the reference generator.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "trainer/config/config.h"

namespace freeride::config_internal {

enum class KeyType { kInt, kFloat, kBool, kString, kIntList, kStringList };

struct KeySpec {
  std::string section;
  std::string key;
  KeyType type = KeyType::kInt;
  std::function<void*(Config&)> field;  // points at the member of `type`'s C++ type
  std::string doc;
  bool required = false;
  std::optional<double> min;
  bool min_exclusive = false;
  std::optional<double> max;
  bool max_exclusive = false;
  std::vector<std::string> choices;

  std::string FullName() const { return section + "." + key; }
  // "an integer >= 1", "one of \"cpu\", \"cuda\"", "a list of integers", ...
  std::string Expected() const;

  KeySpec& Doc(std::string text) { doc = std::move(text); return *this; }
  KeySpec& Required() { required = true; return *this; }
  KeySpec& Min(double v, bool exclusive = false) { min = v; min_exclusive = exclusive; return *this; }
  KeySpec& Max(double v, bool exclusive = false) { max = v; max_exclusive = exclusive; return *this; }
  KeySpec& Choices(std::vector<std::string> c) { choices = std::move(c); return *this; }
};

// Every key of every section, in documentation order.
const std::vector<KeySpec>& Schema();
// Section names in documentation order (including "side_tasks", an array of tables).
const std::vector<std::string>& SectionNames();
std::string SectionDoc(absl::string_view section);

// The keys of a `[[side_tasks]]` table, documented by the reference generator.
struct SideTaskKeyDoc {
  std::string key, type, default_value, doc;
};
const std::vector<SideTaskKeyDoc>& SideTaskKeys();

// The value of `spec` in `config`, as TOML.
std::string FieldToToml(const KeySpec& spec, Config& config);
std::string TomlString(absl::string_view text);
std::string TomlFloat(double value);

// Closest of `candidates` to `word` within edit distance 2, or "".
std::string Suggest(absl::string_view word, const std::vector<std::string>& candidates);

}  // namespace freeride::config_internal
