#include "trainer/study/study_blocks.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/files.h"
#include "core/json_fields.h"

namespace freeride {
namespace {

using nlohmann::json;

absl::StatusOr<std::vector<double>> Numbers(const json& record, const char* key, size_t size,
                                            const std::string& where) {
  if (!record.contains(key) || !record[key].is_array() || record[key].size() != size) {
    return absl::DataLossError(
        absl::StrFormat("%s: \"%s\" is not an array of %d numbers", where, key, size));
  }
  std::vector<double> values;
  for (const json& v : record[key]) {
    if (!v.is_number()) {
      return absl::DataLossError(
          absl::StrFormat("%s: \"%s\" holds %s, not a number", where, key, DescribeJson(v)));
    }
    values.push_back(v.get<double>());
  }
  return values;
}

}  // namespace

std::string StudyBlocksPath(const std::string& dir, int rank) {
  return absl::StrFormat("%s/study_blocks_rank%03d.jsonl", dir, rank);
}

absl::Status AppendStudyRound(const std::string& path, int round, int block_steps,
                              const std::vector<Arm>& arms,
                              const std::vector<BlockRecord>& blocks) {
  std::string lines;
  for (const BlockRecord& b : blocks) {
    const json line = {
        {"round", round},     {"arm", arms[b.arm].name},  {"step_s", b.step_s},
        {"bubble", b.bubble}, {"harvested", b.harvested}, {"overrun", b.overrun},
        {"work", b.work},     {"units", b.units},         {"stage_bubble", b.stage_bubble}};
    absl::StrAppend(&lines, line.dump(), "\n");
  }
  absl::StrAppend(&lines,
                  json{{"round_end", round},
                       {"blocks", static_cast<int64_t>(blocks.size())},
                       {"block_steps", block_steps}}
                      .dump(),
                  "\n");
  std::ofstream out(path, std::ios::app);
  out << lines << std::flush;
  if (!out) return absl::DataLossError(absl::StrFormat("cannot append to %s", path));
  return absl::OkStatus();
}

absl::StatusOr<SavedStudy> LoadStudyBlocks(const std::string& path, int block_steps,
                                           const std::vector<Arm>& arms, size_t tasks) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {
    return absl::NotFoundError(absl::StrFormat(
        "--resume: %s cannot be read (%s): no saved blocks to continue from; start the study "
        "without --resume",
        path, text.status().message()));
  }
  SavedStudy saved;
  std::vector<BlockRecord> round;  // blocks after the last closed round
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    ++line_number;
    if (line.empty()) continue;
    const std::string where = absl::StrFormat("%s line %d", path, line_number);
    const json record = json::parse(line, nullptr, /*allow_exceptions=*/false);
    // A line cut short by a kill ends the file: the round it belongs to is not closed.
    if (record.is_discarded() || !record.is_object()) break;
    if (record.contains("round_end")) {
      if (JsonIntOr(record, "block_steps", -1) != block_steps) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: the saved study ran %d-step blocks, this one --block_steps %d; resume with "
            "the same flags, or start afresh with --overwrite",
            where, JsonIntOr(record, "block_steps", -1), block_steps));
      }
      if (!round.empty() && round.front().arm == kAlone) ++saved.parts;
      saved.blocks.insert(saved.blocks.end(), round.begin(), round.end());
      saved.round_ends.push_back(saved.blocks.size());
      round.clear();
      ++saved.rounds;
      continue;
    }
    const std::string name = JsonStringOr(record, "arm", "");
    BlockRecord b;
    b.arm = -1;
    for (size_t a = 0; a < arms.size(); ++a) {
      if (arms[a].name == name) b.arm = static_cast<int>(a);
    }
    if (b.arm < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: arm '%s' is not one of this study's (its [[side_tasks]] changed?); resume with "
          "the same config, or start afresh with --overwrite",
          where, name));
    }
    const double fields[] = {JsonNumberOr(record, "step_s", -1), JsonNumberOr(record, "bubble", -1),
                             JsonNumberOr(record, "harvested", -1),
                             JsonNumberOr(record, "overrun", -1), JsonNumberOr(record, "work", -1)};
    for (double v : fields) {
      if (v < 0) {
        return absl::DataLossError(
            absl::StrFormat("%s: a block's step_s, bubble, harvested, overrun and work are "
                            "numbers >= 0",
                            where));
      }
    }
    b.step_s = fields[0], b.bubble = fields[1], b.harvested = fields[2], b.overrun = fields[3];
    b.work = fields[4];
    absl::StatusOr<std::vector<double>> units = Numbers(record, "units", tasks, where);
    if (!units.ok()) return units.status();
    b.units = *std::move(units);
    if (!record.contains("stage_bubble") || !record["stage_bubble"].is_array()) {
      return absl::DataLossError(absl::StrFormat("%s: \"stage_bubble\" is not an array", where));
    }
    absl::StatusOr<std::vector<double>> stages =
        Numbers(record, "stage_bubble", record["stage_bubble"].size(), where);
    if (!stages.ok()) return stages.status();
    b.stage_bubble = *std::move(stages);
    round.push_back(std::move(b));
  }
  return saved;
}

}  // namespace freeride
