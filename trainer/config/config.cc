#include "trainer/config/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/files.h"
#include "core/status.h"
#include "freeride/task_args_toml.h"
#include "trainer/config/config_loader.h"
#include "trainer/config/config_schema.h"

namespace freeride {
namespace {

using config_internal::KeySpec;
using config_internal::KeyType;
using config_internal::Loader;
using config_internal::Origin;
using config_internal::Schema;

std::string Describe(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string:
      return absl::StrCat("a string (", config_internal::TomlString(*node.value<std::string>()),
                          ")");
    case toml::node_type::integer:
      return absl::StrCat("an integer (", *node.value<int64_t>(), ")");
    case toml::node_type::floating_point:
      return absl::StrCat("a number (", config_internal::TomlFloat(*node.value<double>()), ")");
    case toml::node_type::boolean:
      return *node.value<bool>() ? "a boolean (true)" : "a boolean (false)";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    default:
      return "a date or time";
  }
}

}  // namespace

bool IsPlainName(absl::string_view name) {
  return !name.empty() && name.size() <= 64 && name[0] != '.' && name[0] != '-' &&
         std::all_of(name.begin(), name.end(), [](char ch) {
           return absl::ascii_isalnum(ch) || ch == '_' || ch == '-' || ch == '.';
         });
}

namespace {

const KeySpec* FindKey(absl::string_view section, absl::string_view key) {
  for (const KeySpec& spec : Schema()) {
    if (spec.section == section && spec.key == key) return &spec;
  }
  return nullptr;
}

std::string DidYouMean(absl::string_view word, const std::vector<std::string>& candidates) {
  std::string best = config_internal::Suggest(word, candidates);
  return best.empty() ? "" : absl::StrCat(" (did you mean '", best, "'?)");
}

std::vector<std::string> KeysOf(absl::string_view section) {
  std::vector<std::string> keys;
  for (const KeySpec& spec : Schema()) {
    if (spec.section == section) keys.push_back(spec.key);
  }
  return keys;
}

bool InRange(const KeySpec& spec, double v) {
  if (spec.min && (spec.min_exclusive ? v <= *spec.min : v < *spec.min)) return false;
  if (spec.max && (spec.max_exclusive ? v >= *spec.max : v > *spec.max)) return false;
  return true;
}

}  // namespace

namespace config_internal {

void Loader::SetKey(const KeySpec& spec, const toml::node& node, const Origin& origin) {
  const std::string name = spec.FullName();
  origins_[name] = origin;
  config.explicit_keys.insert(name);
  void* field = spec.field(config);
  switch (spec.type) {
    case KeyType::kInt:
      if (!node.is_integer()) return Mismatch(origin, name, spec.Expected(), Describe(node));
      if (!InRange(spec, static_cast<double>(*node.value<int64_t>()))) {
        return Mismatch(origin, name, spec.Expected(), Describe(node));
      }
      *static_cast<int64_t*>(field) = *node.value<int64_t>();
      return;
    case KeyType::kFloat:
      if (!node.is_number()) return Mismatch(origin, name, spec.Expected(), Describe(node));
      if (!std::isfinite(*node.value<double>()) || !InRange(spec, *node.value<double>())) {
        return Mismatch(origin, name, spec.Expected(), Describe(node));
      }
      *static_cast<double*>(field) = *node.value<double>();
      return;
    case KeyType::kBool:
      if (!node.is_boolean()) return Mismatch(origin, name, spec.Expected(), Describe(node));
      *static_cast<bool*>(field) = *node.value<bool>();
      return;
    case KeyType::kString: {
      if (!node.is_string()) return Mismatch(origin, name, spec.Expected(), Describe(node));
      std::string value = *node.value<std::string>();
      if (!spec.choices.empty() &&
          std::find(spec.choices.begin(), spec.choices.end(), value) == spec.choices.end()) {
        return Mismatch(origin, name, spec.Expected(), Describe(node));
      }
      *static_cast<std::string*>(field) = value;
      return;
    }
    case KeyType::kIntList: {
      const toml::array* array = node.as_array();
      std::vector<int64_t> values;
      if (array != nullptr) {
        for (const toml::node& element : *array) {
          if (!element.is_integer()) {
            return Mismatch(origin, name, spec.Expected(),
                            absl::StrCat("an array holding ", Describe(element)));
          }
          values.push_back(*element.value<int64_t>());
        }
      } else {
        return Mismatch(origin, name, spec.Expected(), Describe(node));
      }
      *static_cast<std::vector<int64_t>*>(field) = values;
      return;
    }
    case KeyType::kStringList: {
      const toml::array* array = node.as_array();
      if (array == nullptr) return Mismatch(origin, name, spec.Expected(), Describe(node));
      std::vector<std::string> values;
      for (const toml::node& element : *array) {
        const bool allowed =
            element.is_string() && (spec.choices.empty() ||
                                    std::find(spec.choices.begin(), spec.choices.end(),
                                              *element.value<std::string>()) != spec.choices.end());
        if (!allowed) {
          return Mismatch(origin, name, spec.Expected(),
                          absl::StrCat("an array holding ", Describe(element)));
        }
        values.push_back(*element.value<std::string>());
      }
      *static_cast<std::vector<std::string>*>(field) = values;
      return;
    }
  }
}

void Loader::LoadDocument(const toml::table& root) {
  const auto& sections = config_internal::SectionNames();
  for (auto&& [section_key, section_node] : root) {
    const std::string section(section_key.str());
    const Origin origin = At(section_key.source());
    if (section == "side_tasks") {
      const toml::array* tasks = section_node.as_array();
      if (tasks == nullptr) {
        Mismatch(origin, section, "an array of tables ([[side_tasks]])", Describe(section_node));
        continue;
      }
      for (const toml::node& task : *tasks) {
        if (!task.is_table()) {
          Mismatch(At(task.source()), section, "a table ([[side_tasks]])", Describe(task));
          continue;
        }
        config.side_tasks.emplace_back();
        LoadSideTask(config.side_tasks.size() - 1, *task.as_table());
      }
      continue;
    }
    if (std::find(sections.begin(), sections.end(), section) == sections.end()) {
      Error(origin, section,
            absl::StrCat("unknown section", DidYouMean(section, sections),
                         "; known sections: ", absl::StrJoin(sections, ", ")));
      continue;
    }
    const toml::table* table = section_node.as_table();
    if (table == nullptr) {
      Mismatch(origin, section, absl::StrCat("a table ([", section, "])"),
               Describe(section_node));
      continue;
    }
    origins_[section] = origin;
    for (auto&& [key, node] : *table) {
      const std::string key_name(key.str());
      const KeySpec* spec = FindKey(section, key_name);
      if (spec == nullptr) {
        Error(At(key.source()), absl::StrCat(section, ".", key_name),
              absl::StrCat("unknown key", DidYouMean(key_name, KeysOf(section)),
                           "; keys of [", section, "]: ", absl::StrJoin(KeysOf(section), ", ")));
        continue;
      }
      SetKey(*spec, node, At(node.source()));
    }
  }
}

void Loader::LoadSideTask(size_t index, const toml::table& table) {
  for (auto&& [key, node] : table) {
    SetSideTaskKey(index, std::string(key.str()), node, At(node.source()));
  }
  SideTaskConfig& task = config.side_tasks[index];
  const std::string prefix = absl::StrCat("side_tasks[", index, "]");
  origins_[prefix] = At(table.source());
  if (task.type.empty() && table.get("type") == nullptr) {
    Error(At(table.source()), absl::StrCat(prefix, ".type"),
          "required key missing (the registered task type, e.g. \"pagerank\")");
  }
}

void Loader::SetSideTaskKey(size_t index, absl::string_view key, const toml::node& node,
                            const Origin& origin) {
  SideTaskConfig& task = config.side_tasks[index];
  const std::string name = absl::StrCat("side_tasks[", index, "].", key);
  origins_[name] = origin;
  if (key == "isolation") {
    if (!node.is_string() || (*node.value<std::string>() != "process" &&
                              *node.value<std::string>() != "inprocess")) {
      return Mismatch(origin, name, "\"process\" or \"inprocess\"", Describe(node));
    }
    task.isolation = *node.value<std::string>();
  } else if (key == "type" || key == "name" || key == "plugin") {
    if (!node.is_string() || node.value<std::string>()->empty()) {
      return Mismatch(origin, name, "a non-empty string", Describe(node));
    }
    (key == "type" ? task.type : key == "name" ? task.name : task.plugin) =
        *node.value<std::string>();
  } else if (key == "priority") {
    if (!node.is_integer()) return Mismatch(origin, name, "an integer", Describe(node));
    task.priority = *node.value<int64_t>();
  } else if (key == "repeat") {
    if (!node.is_boolean()) return Mismatch(origin, name, "true or false", Describe(node));
    task.repeat = *node.value<bool>();
  } else if (key == "stages") {
    static constexpr char kExpected[] = "\"all\" or a non-empty list of stage numbers >= 0";
    if (node.is_string() && *node.value<std::string>() == "all") {
      task.stages.clear();
      return;
    }
    const toml::array* array = node.as_array();
    if (array == nullptr || array->empty()) return Mismatch(origin, name, kExpected, Describe(node));
    std::vector<int64_t> stages;
    for (const toml::node& element : *array) {
      if (!element.is_integer() || *element.value<int64_t>() < 0) {
        return Mismatch(origin, name, kExpected,
                        absl::StrCat("an array holding ", Describe(element)));
      }
      stages.push_back(*element.value<int64_t>());
    }
    task.stages = stages;
  } else if (key == "memory_limit") {
    static constexpr char kExpected[] = "bytes >= 0 or a size such as \"512MiB\"";
    if (node.is_integer() && *node.value<int64_t>() >= 0) {
      task.memory_limit_bytes = *node.value<int64_t>();
    } else if (node.is_string()) {
      auto bytes = ParseByteSize(*node.value<std::string>());
      if (!bytes.ok()) return Mismatch(origin, name, kExpected, Describe(node));
      task.memory_limit_bytes = *bytes;
    } else {
      return Mismatch(origin, name, kExpected, Describe(node));
    }
  } else if (key == "args") {
    const toml::table* args = node.as_table();
    if (args == nullptr) return Mismatch(origin, name, "a table", Describe(node));
    for (auto&& [arg, value] : *args) {
      SetArg(index, std::string(arg.str()), value, At(value.source()));
    }
  } else {
    std::vector<std::string> keys;
    for (const auto& doc : config_internal::SideTaskKeys()) keys.push_back(doc.key);
    Error(origin, name,
          absl::StrCat("unknown key", DidYouMean(key, keys),
                       "; keys of [[side_tasks]]: ", absl::StrJoin(keys, ", "),
                       " (task arguments go in [side_tasks.args])"));
  }
}

void Loader::SetArg(size_t index, absl::string_view name, const toml::node& node,
                    const Origin& origin) {
  const std::string key = absl::StrCat("side_tasks[", index, "].args.", name);
  origins_[key] = origin;
  if (std::optional<ArgValue> value = ArgFromToml(node)) {
    config.side_tasks[index].args[std::string(name)] = *std::move(value);
    return;
  }
  Mismatch(origin, key, "a boolean, number, string, or a non-empty list of one of those",
           Describe(node));
}


void Loader::ApplyOverride(const std::string& assignment) {
  const Origin origin{absl::StrCat("--set ", assignment)};
  const size_t equals = assignment.find('=');
  if (equals == std::string::npos || equals == 0) {
    errors.push_back(absl::StrCat(origin.Where(), ": expected section.key=value"));
    return;
  }
  const std::string path(absl::StripAsciiWhitespace(assignment.substr(0, equals)));
  const std::string text(absl::StripAsciiWhitespace(assignment.substr(equals + 1)));
  // The value is TOML ("3", "0.5", "true", "[2, 2]", "\"x\""); a bare word is a string.
  toml::table parsed;
  bool is_toml = true;
  try {
    parsed = toml::parse(absl::StrCat("v = ", text));
  } catch (const toml::parse_error&) {
    is_toml = false;
  }
  const toml::value<std::string> bare(text);
  const toml::node& value = is_toml ? *parsed.get("v") : static_cast<const toml::node&>(bare);

  std::vector<std::string> parts = absl::StrSplit(path, '.');
  if (parts[0] == "side_tasks") {
    size_t index = 0;
    if (parts.size() < 3 || !absl::SimpleAtoi(parts[1], &index) ||
        index >= config.side_tasks.size() || (parts.size() > 3 && parts[2] != "args") ||
        parts.size() > 4) {
      errors.push_back(absl::StrCat(
          origin.Where(), ": ", path, ": expected side_tasks.N.key or side_tasks.N.args.name with N below ",
          config.side_tasks.size(), " (the number of [[side_tasks]] tables)"));
      return;
    }
    if (parts.size() == 4) return SetArg(index, parts[3], value, origin);
    // A bare word given for a string key of a side task is a string, as for sections.
    return SetSideTaskKey(index, parts[2], value, origin);
  }
  if (parts.size() != 2) {
    errors.push_back(absl::StrCat(origin.Where(), ": ", path, ": expected section.key"));
    return;
  }
  const KeySpec* spec = FindKey(parts[0], parts[1]);
  if (spec == nullptr) {
    std::vector<std::string> names;
    for (const KeySpec& s : Schema()) names.push_back(s.FullName());
    Error(origin, path, absl::StrCat("unknown key", DidYouMean(path, names)));
    return;
  }
  if (spec->type == KeyType::kString && !value.is_string()) return SetKey(*spec, bare, origin);
  SetKey(*spec, value, origin);
}

void Loader::CheckRequired() {
  for (const KeySpec& spec : Schema()) {
    if (!spec.required || origins_.count(spec.FullName()) > 0) continue;
    Origin where = OriginOf(spec.section);
    Error(where, spec.FullName(), absl::StrCat("required key missing (", spec.Expected(), ": ",
                                               spec.doc, ")"));
  }
}

}  // namespace config_internal

namespace {

absl::Status SyntaxError(const toml::parse_error& e, absl::string_view source) {
  return absl::InvalidArgumentError(absl::StrCat(source, ":", e.source().begin.line, ":",
                                                 e.source().begin.column, ": TOML syntax error: ",
                                                 std::string(e.description())));
}

}  // namespace

absl::StatusOr<Config> ParseConfig(absl::string_view text, absl::string_view source,
                                   const std::vector<std::string>& overrides,
                                   bool check_data_files) {
  Loader loader(source);
  try {
    toml::table root = toml::parse(std::string_view(text.data(), text.size()), std::string(source));
    loader.LoadDocument(root);
  } catch (const toml::parse_error& e) {
    return SyntaxError(e, source);
  }
  for (const std::string& assignment : overrides) loader.ApplyOverride(assignment);
  loader.CheckRequired();
  loader.CheckCrossField(check_data_files);
  if (!loader.errors.empty()) {
    return absl::InvalidArgumentError(absl::StrJoin(loader.errors, "\n"));
  }
  for (size_t i = 0; i < loader.config.side_tasks.size(); ++i) {
    SideTaskConfig& task = loader.config.side_tasks[i];
    if (task.name.empty()) task.name = task.type;
    if (task.isolation.empty()) task.isolation = DefaultIsolation(task);
    task.origins = loader.SideTaskOrigins(i);
  }
  return loader.config;
}

absl::StatusOr<SideTaskConfig> ParseSideTaskFile(absl::string_view text, absl::string_view source,
                                                 const Config& run) {
  Loader loader(source);
  loader.config = run;
  loader.config.side_tasks.clear();
  toml::table root;
  try {
    root = toml::parse(std::string_view(text.data(), text.size()), std::string(source));
  } catch (const toml::parse_error& e) {
    return SyntaxError(e, source);
  }
  const toml::array* tables = root["side_tasks"].as_array();
  const size_t found = tables == nullptr ? 0 : tables->size();
  // What else is there, named as it is written: "[train]", "[[x]]", "key steps".
  std::vector<std::string> others;
  for (const auto& [key, node] : root) {
    const std::string name(key.str());
    if (name == "side_tasks" && tables != nullptr) continue;
    others.push_back(node.is_table()             ? absl::StrCat("[", name, "]")
                     : node.is_array_of_tables() ? absl::StrCat("[[", name, "]]")
                                                 : absl::StrCat("the key ", name));
  }
  if (found != 1 || !others.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": expected one [[side_tasks]] table and nothing else, found ", found,
        " [[side_tasks]] table(s)",
        others.empty() ? "" : absl::StrCat(" and ", absl::StrJoin(others, ", ")),
        others.empty() ? "" : " (a job file holds the task alone; the run's config holds the rest)"));
  }
  loader.LoadDocument(root);
  loader.CheckCrossField();
  if (!loader.errors.empty()) return absl::InvalidArgumentError(absl::StrJoin(loader.errors, "\n"));
  SideTaskConfig task = loader.config.side_tasks[0];
  if (task.name.empty()) task.name = task.type;
  if (task.isolation.empty()) task.isolation = DefaultIsolation(task);
  task.origins = loader.SideTaskOrigins(0);
  return task;
}

std::string DefaultIsolation(const SideTaskConfig& task) {
  return !task.plugin.empty() || task.type == "command" ? "process" : "inprocess";
}

absl::StatusOr<Config> LoadConfigFile(const std::string& path,
                                      const std::vector<std::string>& overrides,
                                      bool check_data_files) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return Annotate(text.status(), "reading the config file");
  return ParseConfig(*text, path, overrides, check_data_files);
}

}  // namespace freeride
