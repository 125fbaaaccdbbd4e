#include "pipeline/schedule_file.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/files.h"
#include "core/status.h"
#include "pipeline/passes.h"
#include "pipeline/validator.h"

namespace freeride::pipeline {
namespace {

struct TorchAction {
  int stage = 0;  // global (virtual) stage
  Op op = Op::kForward;
  int microbatch = -1;
  bool compute = false;
};

// After the stage digits: the longer names first, so that "SEND_F" is not read as a bare op.
constexpr std::pair<const char*, Op> kTorchTypes[] = {
    {"SEND_F", Op::kSendAct}, {"RECV_F", Op::kRecvAct}, {"SEND_B", Op::kSendGrad},
    {"RECV_B", Op::kRecvGrad}, {"F", Op::kForward},     {"I", Op::kBackwardInput},
    {"W", Op::kBackwardWeight}, {"B", Op::kBackward},
};

absl::StatusOr<TorchAction> ParseTorchAction(absl::string_view cell) {
  TorchAction a;
  size_t digits = 0;
  while (digits < cell.size() && absl::ascii_isdigit(cell[digits])) ++digits;
  if (digits == 0 || !absl::SimpleAtoi(cell.substr(0, digits), &a.stage)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", cell, "': expected [stage][op][micro-batch], e.g. 2F0"));
  }
  absl::string_view rest = cell.substr(digits);
  for (const char* refused : {"UNSHARD", "RESHARD", "REDUCE_GRAD"}) {
    if (absl::StartsWith(rest, refused)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", cell, "': ", refused, " (FSDP and gradient-reduction actions) has no "
          "counterpart here; write the schedule without it"));
    }
  }
  for (const auto& [name, op] : kTorchTypes) {
    if (!absl::ConsumePrefix(&rest, name)) continue;
    a.op = op;
    a.compute = IsCompute(op);
    if (!absl::SimpleAtoi(rest, &a.microbatch) || a.microbatch < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", cell, "': expected a micro-batch number after ", name));
    }
    return a;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "'", cell, "': unknown action; expected F, I, W, B, SEND_F, RECV_F, SEND_B or RECV_B"));
}

char TorchLetter(Op op) {
  switch (op) {
    case Op::kForward: return 'F';
    case Op::kBackwardInput: return 'I';
    case Op::kBackwardWeight: return 'W';
    default: return 'B';
  }
}

enum class Form { kText, kCsv, kTorchCsv };

Form Detect(absl::string_view text) {
  if (absl::StrContains(text, "stage,index,op")) return Form::kCsv;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    return absl::StartsWith(line, "stage") ? Form::kText : Form::kTorchCsv;
  }
  return Form::kText;
}

// The file line each stage starts on (text: its "stageN:" line; torch CSV: its row), and for
// the freeride CSV each instruction's row.
struct Lines {
  std::vector<int> stage;
  std::map<std::pair<int, int>, int> row;
};

Lines FindLines(absl::string_view text, Form form) {
  Lines lines;
  int number = 0, rows = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (form == Form::kTorchCsv) {
      if (!absl::StartsWith(line, "#")) lines.stage.push_back(number);
      continue;
    }
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    if (form == Form::kText) {
      lines.stage.push_back(number);
    } else if (++rows > 1) {
      std::vector<absl::string_view> f = absl::StrSplit(line, ',');
      int stage = 0, index = 0;
      if (f.size() > 1 && absl::SimpleAtoi(f[0], &stage) && absl::SimpleAtoi(f[1], &index)) {
        lines.row[{stage, index}] = number;
        if (static_cast<int>(lines.stage.size()) <= stage) lines.stage.resize(stage + 1, number);
      }
    }
  }
  return lines;
}

bool IsCommunication(Op op) { return !IsCompute(op) && op != Op::kBubble; }

}  // namespace

absl::StatusOr<Schedule> ScheduleFromTorchCsv(absl::string_view text) {
  std::vector<absl::string_view> rows = absl::StrSplit(text, '\n');
  while (!rows.empty() && absl::StripAsciiWhitespace(rows.back()).empty()) rows.pop_back();
  std::erase_if(rows, [](absl::string_view r) { return absl::StartsWith(r, "#"); });
  if (rows.empty()) return absl::InvalidArgumentError("torch csv: no rows (one per rank)");
  const int p = static_cast<int>(rows.size());
  std::vector<std::vector<TorchAction>> ranks(p);
  int stages = 0, microbatches = 0;
  for (int r = 0; r < p; ++r) {
    for (absl::string_view cell : absl::StrSplit(rows[r], ',')) {
      cell = absl::StripAsciiWhitespace(cell);
      if (cell.empty()) continue;  // idle: the passes place the bubbles
      std::vector<absl::string_view> parts = {cell};
      if (absl::ConsumePrefix(&cell, "(")) {
        const size_t close = cell.find(')');
        if (close == absl::string_view::npos || cell.substr(close + 1) != "OVERLAP_F_B") {
          return absl::InvalidArgumentError(absl::StrCat(
              "torch csv row ", r + 1, ": expected (a;b)OVERLAP_F_B, found '(", cell, "'"));
        }
        // An overlapped forward and backward run here one after the other.
        parts = absl::StrSplit(cell.substr(0, close), ';', absl::SkipWhitespace());
      }
      for (absl::string_view part : parts) {
        absl::StatusOr<TorchAction> a = ParseTorchAction(absl::StripAsciiWhitespace(part));
        if (!a.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat("torch csv row ", r + 1, ": ", a.status().message()));
        }
        if (!a->compute) continue;
        ranks[r].push_back(*a);
        stages = std::max(stages, a->stage + 1);
        microbatches = std::max(microbatches, a->microbatch + 1);
      }
    }
  }
  if (stages % p != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "torch csv: ", stages, " stages cannot be spread evenly over ", p, " ranks (rows)"));
  }
  Schedule s;
  s.kind = ScheduleKind::kCustom;
  s.stages = p;
  s.chunks = stages / p;
  s.microbatches = microbatches;
  s.per_stage.resize(p);
  // The placement that puts every stage on the rank that runs it.
  bool loop = true, v = true;
  for (int r = 0; r < p; ++r) {
    for (const TorchAction& a : ranks[r]) {
      loop = loop && StageOfVirtual(Placement::kLoop, p, a.stage) == r;
      v = v && StageOfVirtual(Placement::kV, p, a.stage) == r;
    }
  }
  if (!loop && !v) {
    return absl::InvalidArgumentError(absl::StrCat(
        "torch csv: the ranks run their stages in neither a loop (stage k on rank k mod ", p,
        ") nor a V (stages 0..", p - 1, " down the ranks, the next ", p, " back up)"));
  }
  s.placement = loop ? Placement::kLoop : Placement::kV;
  for (int r = 0; r < p; ++r) {
    for (const TorchAction& a : ranks[r]) {
      Instr in;
      in.op = a.op;
      in.stage = r;
      in.chunk = a.stage / p;
      in.microbatch = a.microbatch;
      s.per_stage[r].push_back(in);
    }
  }
  return s;
}

std::string ScheduleToTorchCsv(const Schedule& schedule) {
  std::string out;
  for (const auto& stage : schedule.per_stage) {
    std::vector<std::string> cells;
    for (const Instr& in : stage) {
      if (!IsCompute(in.op)) continue;
      cells.push_back(absl::StrCat(VirtualStage(schedule, in), std::string(1, TorchLetter(in.op)),
                                   in.microbatch));
    }
    absl::StrAppend(&out, absl::StrJoin(cells, ","), "\n");
  }
  return out;
}

absl::StatusOr<Schedule> LoadScheduleFile(const std::string& path, const CostModel& cost,
                                          bool data_parallel) {
  FR_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  const Form form = Detect(text);
  absl::StatusOr<Schedule> loaded = form == Form::kCsv     ? ScheduleFromCsv(text)
                                    : form == Form::kText ? ScheduleFromText(text)
                                                          : ScheduleFromTorchCsv(text);
  if (!loaded.ok()) return Annotate(loaded.status(), path);
  Schedule s = *std::move(loaded);
  bool has_comm = false, has_peers = false, has_buffers = false, has_bubbles = false,
       has_reduce = false;
  for (const auto& stage : s.per_stage) {
    for (const Instr& in : stage) {
      has_comm = has_comm || IsCommunication(in.op);
      has_peers = has_peers || in.peer >= 0;
      has_buffers = has_buffers || in.buffer >= 0;
      has_bubbles = has_bubbles || in.op == Op::kBubble;
      has_reduce = has_reduce || in.op == Op::kReduceGrads;
    }
  }
  if (!has_comm) {
    InsertCommunication(&s, data_parallel);
  } else if (data_parallel && !has_reduce) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": has no REDUCE_GRADS, but the run is data-parallel (parallel.dp > 1); add one "
        "before each stage's OPTIMIZER, or leave out all communication and let it be placed"));
  }
  if (!has_peers) ResolvePeers(&s);
  if (!has_buffers) {
    s.buffers_per_stage.clear();
    AssignBuffers(&s);
  } else if (s.buffers_per_stage.empty()) {
    // Hand-given buffer ids: the stage needs as many slots as the highest id used.
    s.buffers_per_stage.assign(s.stages, 0);
    for (const auto& stage : s.per_stage) {
      for (const Instr& in : stage) {
        if (in.stage >= 0 && in.stage < s.stages) {
          s.buffers_per_stage[in.stage] = std::max(s.buffers_per_stage[in.stage], in.buffer + 1);
        }
      }
    }
  }
  ValidationSite site;
  if (absl::Status v = Validate(s, &site); !v.ok()) {
    const Lines lines = FindLines(text, form);
    int line = 0;
    if (auto it = lines.row.find({site.stage, site.position}); has_comm && it != lines.row.end()) {
      line = it->second;
    } else if (site.stage >= 0 && site.stage < static_cast<int>(lines.stage.size())) {
      line = lines.stage[site.stage];
    }
    return absl::InvalidArgumentError(
        line > 0 ? absl::StrCat(path, ":", line, ": ", v.message())
                 : absl::StrCat(path, ": ", v.message()));
  }
  if (!has_bubbles) FR_RETURN_IF_ERROR(InsertBubbles(&s, cost));
  return s;
}

}  // namespace freeride::pipeline
