// Command-line options for subcommands: `--name value`, `--name=value`, boolean `--name`,
// repeatable options (`--set a=1 --set b=2`) and positional arguments. Every option a command
// accepts is declared first, so a misspelt option is an error (naming the nearest declared
// one), never silently ignored. "--" ends the options. CLI11 does the reading.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace freeride {

struct FlagSpec {
  std::string name;  // without the leading "--"
  std::string value_name;  // empty for a boolean switch
  std::string help;
  bool repeated = false;
};

class ParsedFlags {
 public:
  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  // The last value given, or `fallback`.
  std::string Get(const std::string& name, const std::string& fallback = "") const;
  std::vector<std::string> GetAll(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  friend absl::StatusOr<ParsedFlags> ParseFlags(const std::vector<std::string>&,
                                                const std::vector<FlagSpec>&);
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
};

absl::StatusOr<ParsedFlags> ParseFlags(const std::vector<std::string>& args,
                                       const std::vector<FlagSpec>& specs);

// The value of `--name` as an integer >= 1 (`fallback` when absent), or an error naming the
// option and what it found.
absl::StatusOr<int64_t> PositiveIntFlag(const ParsedFlags& flags, const std::string& name,
                                        int64_t fallback);
// The same for a number > 0.
absl::StatusOr<double> PositiveNumberFlag(const ParsedFlags& flags, const std::string& name,
                                          double fallback);

// `--name NAME=X,NAME=X,...` as (name, number >= 0) pairs in the order given, or an error naming
// the option and the item that is not NAME=number.
absl::StatusOr<std::vector<std::pair<std::string, double>>> NamedNumbersFlag(
    const ParsedFlags& flags, const std::string& name);

// "  --name VALUE   help" lines for a command's usage text.
std::string FlagsHelp(const std::vector<FlagSpec>& specs);

}  // namespace freeride
