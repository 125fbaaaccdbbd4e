#include "trainer/config/flags.h"

#include <algorithm>
#include <cmath>

#include "CLI/CLI.hpp"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_format.h"
#include "trainer/config/config_schema.h"

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
  if (!absl::SimpleAtod(flags.Get(name), &value) || !std::isfinite(value) || !(value > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", name, ": expected a finite number > 0, found '", flags.Get(name), "'"));
  }
  return value;
}

absl::StatusOr<std::vector<std::pair<std::string, double>>> NamedNumbersFlag(
    const ParsedFlags& flags, const std::string& name) {
  std::vector<std::pair<std::string, double>> out;
  for (absl::string_view item : absl::StrSplit(flags.Get(name), ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    double value = 0;
    if (kv.first.empty() || !absl::SimpleAtod(kv.second, &value) || !std::isfinite(value) ||
        !(value >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", name, ": '", item, "': expected NAME=number with a finite number >= 0"));
    }
    out.emplace_back(kv.first, value);
  }
  return out;
}

namespace {

// "unknown option --name", with the closest declared option when one is near.
absl::Status UnknownOption(const std::string& arg, const std::vector<FlagSpec>& specs) {
  std::string name = arg.substr(2, arg.find('=') == std::string::npos ? std::string::npos
                                                                       : arg.find('=') - 2);
  std::vector<std::string> names;
  for (const FlagSpec& spec : specs) names.push_back(spec.name);
  const std::string best = config_internal::Suggest(name, names);
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown option --", name, best.empty() ? "" : absl::StrCat(" (did you mean --", best,
                                                                  "?)")));
}

// What is wrong with `args`, which CLI11 refused with `error`: an option that is not declared, a
// value given to a switch, or an option without its value.
absl::Status ParseProblem(const std::vector<std::string>& args, const std::vector<FlagSpec>& specs,
                          const CLI::ParseError& error) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") break;
    if (arg.size() < 3 || arg.rfind("--", 0) != 0) continue;
    const size_t equals = arg.find('=');
    const std::string name = arg.substr(2, equals == std::string::npos ? equals : equals - 2);
    auto spec = std::find_if(specs.begin(), specs.end(),
                             [&](const FlagSpec& s) { return s.name == name; });
    if (spec == specs.end()) return UnknownOption(arg, specs);
    if (spec->value_name.empty() && equals != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("option --", name, " takes no value"));
    }
    // The next argument is the value, whatever it looks like: only the last can lack one.
    if (!spec->value_name.empty() && equals == std::string::npos && i + 1 == args.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("option --", name, " needs a value (", spec->value_name, ")"));
    }
  }
  return absl::InvalidArgumentError(error.what());
}

}  // namespace

// CLI11 reads the arguments; the messages are ours, so that each names the option and what it
// needs the way the config errors do. Only long options exist: anything that does not begin
// with "--" is an operand (a file, a run directory), as is a lone "-".
absl::StatusOr<ParsedFlags> ParseFlags(const std::vector<std::string>& args,
                                       const std::vector<FlagSpec>& specs) {
  CLI::App app;
  app.set_help_flag();  // --help is the command line's (cli.cc), before parsing
  app.allow_windows_style_options(false);
  std::vector<std::vector<std::string>> values(specs.size());
  std::vector<int64_t> switches(specs.size(), 0);
  for (size_t i = 0; i < specs.size(); ++i) {
    const FlagSpec& spec = specs[i];
    if (spec.value_name.empty()) {
      // Counted, so that a repeat is seen; a value ("--verbose=yes") is refused.
      app.add_flag("--" + spec.name, switches[i])->disable_flag_override();
    } else {
      // One value an occurrence ("--set a=1 b" leaves b an operand), every occurrence kept.
      app.add_option("--" + spec.name, values[i])
          ->type_size(1)
          ->expected(1)
          ->allow_extra_args(false)
          ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    }
  }
  ParsedFlags parsed;
  // Operands and unknown options are both CLI11's extras; an option name is told apart below.
  app.allow_extras();
  // CLI11 takes its arguments last first.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return ParseProblem(args, specs, e);
  }
  // After "--" every argument is an operand, as getopt has it.
  bool operands_only = false;
  for (const std::string& extra : app.remaining()) {
    if (!operands_only && extra == "--") {
      operands_only = true;
    } else if (!operands_only && extra.size() >= 3 && extra.rfind("--", 0) == 0) {
      return UnknownOption(extra, specs);
    } else {
      parsed.positional_.push_back(extra);
    }
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const FlagSpec& spec = specs[i];
    const size_t given = spec.value_name.empty() ? switches[i] : values[i].size();
    if (given > 1 && !spec.repeated) {
      return absl::InvalidArgumentError(absl::StrCat("option --", spec.name, " given twice"));
    }
    if (given == 0) continue;
    parsed.values_[spec.name] =
        spec.value_name.empty() ? std::vector<std::string>(given, "true") : values[i];
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
