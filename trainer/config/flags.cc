#include "trainer/config/flags.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_format.h"

namespace freeride {

std::string ParsedFlags::Get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() || it->second.empty() ? fallback : it->second.back();
}

std::vector<std::string> ParsedFlags::GetAll(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

absl::StatusOr<int64_t> PositiveIntFlag(const ParsedFlags& flags, const std::string& name,
                                        int64_t fallback) {
  if (!flags.Has(name)) return fallback;
  int64_t value = 0;
  if (!absl::SimpleAtoi(flags.Get(name), &value) || value < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": expected an integer >= 1, "
                                                   "found '", flags.Get(name), "'"));
  }
  return value;
}

absl::StatusOr<double> PositiveNumberFlag(const ParsedFlags& flags, const std::string& name,
                                          double fallback) {
  if (!flags.Has(name)) return fallback;
  double value = 0;
  if (!absl::SimpleAtod(flags.Get(name), &value) || !(value > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": expected a number > 0, found '",
                                                   flags.Get(name), "'"));
  }
  return value;
}

absl::StatusOr<std::vector<std::pair<std::string, double>>> NamedNumbersFlag(
    const ParsedFlags& flags, const std::string& name) {
  std::vector<std::pair<std::string, double>> out;
  for (absl::string_view item : absl::StrSplit(flags.Get(name), ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    double value = 0;
    if (kv.first.empty() || !absl::SimpleAtod(kv.second, &value) || !(value >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", name, ": '", item, "': expected NAME=number with a number >= 0"));
    }
    out.emplace_back(kv.first, value);
  }
  return out;
}

absl::StatusOr<ParsedFlags> ParseFlags(const std::vector<std::string>& args,
                                       const std::vector<FlagSpec>& specs) {
  ParsedFlags parsed;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.size() < 3 || arg.rfind("--", 0) != 0) {
      parsed.positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (auto equals = name.find('='); equals != std::string::npos) {
      value = name.substr(equals + 1);
      name.resize(equals);
      has_value = true;
    }
    auto spec = std::find_if(specs.begin(), specs.end(),
                             [&](const FlagSpec& s) { return s.name == name; });
    if (spec == specs.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown option --", name));
    }
    if (spec->value_name.empty()) {
      if (has_value) {
        return absl::InvalidArgumentError(absl::StrCat("option --", name, " takes no value"));
      }
      value = "true";
    } else if (!has_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("option --", name, " needs a value (", spec->value_name, ")"));
      }
      value = args[++i];
    }
    auto& slot = parsed.values_[name];
    if (!spec->repeated && !slot.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("option --", name, " given twice"));
    }
    slot.push_back(value);
  }
  return parsed;
}

std::string FlagsHelp(const std::vector<FlagSpec>& specs) {
  std::string out;
  for (const FlagSpec& spec : specs) {
    std::string left = absl::StrCat("--", spec.name,
                                    spec.value_name.empty() ? "" : " " + spec.value_name);
    absl::StrAppend(&out, absl::StrFormat("  %-28s %s%s\n", left, spec.help,
                                          spec.repeated ? " (repeatable)" : ""));
  }
  return out;
}

}  // namespace freeride
