#include "pipeline/schedule.h"

#include <algorithm>
#include <charconv>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace freeride::pipeline {
namespace {

struct OpToken {
  Op op;
  const char* token;  // text-form prefix
  const char* name;   // IR name
};

// Longer prefixes first so that "SEND_F" is not read as "F".
constexpr OpToken kOps[] = {
    {Op::kSendAct, "SEND_F", "SEND_ACT"},       {Op::kRecvAct, "RECV_F", "RECV_ACT"},
    {Op::kSendGrad, "SEND_B", "SEND_GRAD"},     {Op::kRecvGrad, "RECV_B", "RECV_GRAD"},
    {Op::kReduceTied, "REDUCE_TIED", "REDUCE_TIED"},
    {Op::kReduceGrads, "REDUCE_GRADS", "REDUCE_GRADS"},
    {Op::kOptimizer, "OPTIMIZER", "OPTIMIZER"}, {Op::kBubble, "BUBBLE", "BUBBLE"},
    {Op::kLoad, "LOAD", "LOAD"},                {Op::kForward, "F", "FORWARD"},
    {Op::kBackward, "B", "BACKWARD"},           {Op::kBackwardInput, "I", "BACKWARD_INPUT"},
    {Op::kBackwardWeight, "W", "BACKWARD_WEIGHT"},
};

const OpToken& TokenOf(Op op) {
  for (const OpToken& t : kOps) {
    if (t.op == op) return t;
  }
  return kOps[0];
}

bool HasMicrobatch(Op op) {
  return op != Op::kReduceTied && op != Op::kReduceGrads && op != Op::kOptimizer &&
         op != Op::kBubble;
}

std::string FormatDuration(double ms) {
  return absl::StrFormat("%.6gms", ms);
}

absl::StatusOr<double> ParseDuration(absl::string_view text) {
  double scale = 1;
  if (absl::ConsumeSuffix(&text, "ms")) {
    scale = 1;
  } else if (absl::ConsumeSuffix(&text, "us")) {
    scale = 1e-3;
  } else if (absl::ConsumeSuffix(&text, "s")) {
    scale = 1e3;
  }
  double value = 0;
  if (!absl::SimpleAtod(text, &value) || value < 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad duration '", text, "'"));
  }
  return value * scale;
}

std::string Header(const Schedule& s) {
  return absl::StrFormat("# freeride schedule kind=%s stages=%d microbatches=%d chunks=%d%s%s",
                         ScheduleKindName(s.kind), s.stages, s.microbatches, s.chunks,
                         s.placement == Placement::kV ? " placement=v" : "",
                         s.step_sync == StepSync::kPostValidate ? " sync=post_validate" : "");
}

absl::Status TokenError(absl::string_view token, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("bad token '", token, "': ", why));
}

}  // namespace

bool IsCompute(Op op) {
  return op == Op::kForward || op == Op::kBackward || op == Op::kBackwardInput ||
         op == Op::kBackwardWeight;
}

bool IsBackward(Op op) { return op == Op::kBackward || op == Op::kBackwardInput; }

absl::string_view ScheduleKindName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe: return "gpipe";
    case ScheduleKind::k1F1B: return "1f1b";
    case ScheduleKind::kInterleaved: return "interleaved";
    case ScheduleKind::kZBH1: return "zbh1";
    case ScheduleKind::kZBH2: return "zbh2";
    case ScheduleKind::kZBV: return "zbv";
    case ScheduleKind::kDualPipeV: return "dualpipev";
    case ScheduleKind::kCustom: return "custom";
  }
  return "custom";
}

Placement PlacementOf(ScheduleKind kind) {
  return kind == ScheduleKind::kZBV || kind == ScheduleKind::kDualPipeV ? Placement::kV
                                                                         : Placement::kLoop;
}

absl::string_view PlacementName(Placement placement) {
  return placement == Placement::kV ? "v" : "loop";
}

absl::StatusOr<Placement> ParsePlacement(absl::string_view name) {
  if (name == "loop") return Placement::kLoop;
  if (name == "v") return Placement::kV;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown placement '", name, "'; expected loop or v"));
}

absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name) {
  for (ScheduleKind kind :
       {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved,
        ScheduleKind::kZBH1, ScheduleKind::kZBH2, ScheduleKind::kZBV, ScheduleKind::kDualPipeV,
        ScheduleKind::kCustom}) {
    if (name == ScheduleKindName(kind)) return kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown schedule kind '", name,
                   "'; expected gpipe, 1f1b, interleaved, zbh1, zbh2, zbv or dualpipev"));
}

absl::string_view StepSyncName(StepSync sync) {
  return sync == StepSync::kPostValidate ? "post_validate" : "barrier";
}

absl::StatusOr<StepSync> ParseStepSync(absl::string_view name) {
  if (name == "barrier") return StepSync::kBarrier;
  if (name == "post_validate") return StepSync::kPostValidate;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown step sync '", name, "'; expected barrier or post_validate"));
}

size_t ValidationPoint(const std::vector<Instr>& instrs) {
  for (size_t i = 0; i < instrs.size(); ++i) {
    const Op op = instrs[i].op;
    if (op != Op::kLoad && op != Op::kRecvAct && op != Op::kForward && op != Op::kSendAct &&
        op != Op::kBubble) {
      return i;
    }
  }
  return instrs.size();
}

std::vector<BubbleKey> BubbleKeys(const std::vector<Instr>& instrs) {
  std::vector<BubbleKey> keys(instrs.size(), BubbleKey{-1, BubbleKind::kNone, 0});
  int anchor = 0;
  for (size_t i = 0; i < instrs.size(); ++i) {
    if (instrs[i].op != Op::kBubble) {
      ++anchor;
      continue;
    }
    BubbleKey key{anchor, instrs[i].bubble, 0};
    // Earlier BUBBLEs at this anchor sit just before this one.
    for (size_t j = i; j-- > 0 && instrs[j].op == Op::kBubble;) {
      if (instrs[j].bubble == key.kind) ++key.nth;
    }
    keys[i] = key;
  }
  return keys;
}

absl::string_view BubbleKindName(BubbleKind kind) {
  switch (kind) {
    case BubbleKind::kNone: return "none";
    case BubbleKind::kWarmup: return "warmup";
    case BubbleKind::kFill: return "fill";
    case BubbleKind::kSteady: return "steady";
    case BubbleKind::kCooldown: return "cooldown";
    case BubbleKind::kSync: return "sync";
  }
  return "none";
}

absl::StatusOr<BubbleKind> ParseBubbleKind(absl::string_view name) {
  for (int k = 1; k < kNumBubbleKinds; ++k) {
    if (name == BubbleKindName(static_cast<BubbleKind>(k))) return static_cast<BubbleKind>(k);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown bubble kind '", name, "'; expected warmup, fill, steady, cooldown or sync"));
}

absl::string_view OpName(Op op) { return TokenOf(op).name; }

std::string FormatInstr(const Instr& instr, int chunks) {
  const OpToken& t = TokenOf(instr.op);
  if (instr.op == Op::kBubble) {
    return absl::StrCat("BUBBLE(", BubbleKindName(instr.bubble), ",",
                        FormatDuration(instr.duration_ms), ")");
  }
  if (!HasMicrobatch(instr.op)) return t.token;
  std::string text = absl::StrCat(t.token, instr.microbatch);
  if (chunks > 1) absl::StrAppend(&text, "c", instr.chunk);
  return text;
}

absl::StatusOr<Instr> ParseInstr(absl::string_view token, int stage) {
  Instr instr;
  instr.stage = stage;
  const OpToken* match = nullptr;
  for (const OpToken& t : kOps) {
    if (absl::StartsWith(token, t.token)) {
      match = &t;
      break;
    }
  }
  if (match == nullptr) return TokenError(token, "unknown operation");
  instr.op = match->op;
  absl::string_view rest = token.substr(strlen(match->token));
  if (instr.op == Op::kBubble) {
    if (!absl::ConsumePrefix(&rest, "(") || !absl::ConsumeSuffix(&rest, ")")) {
      return TokenError(token, "expected BUBBLE(kind,duration)");
    }
    std::vector<absl::string_view> parts = absl::StrSplit(rest, ',');
    if (parts.size() != 2) return TokenError(token, "expected BUBBLE(kind,duration)");
    absl::StatusOr<BubbleKind> kind = ParseBubbleKind(parts[0]);
    if (!kind.ok()) return TokenError(token, kind.status().message());
    absl::StatusOr<double> ms = ParseDuration(parts[1]);
    if (!ms.ok()) return TokenError(token, ms.status().message());
    instr.bubble = *kind;
    instr.duration_ms = *ms;
    return instr;
  }
  if (!HasMicrobatch(instr.op)) {
    if (!rest.empty()) return TokenError(token, "takes no micro-batch");
    return instr;
  }
  absl::string_view chunk_text;
  if (size_t c = rest.find('c'); c != absl::string_view::npos) {
    chunk_text = rest.substr(c + 1);
    rest = rest.substr(0, c);
  }
  if (!absl::SimpleAtoi(rest, &instr.microbatch) || instr.microbatch < 0) {
    return TokenError(token, "expected a micro-batch number");
  }
  if (!chunk_text.empty() && (!absl::SimpleAtoi(chunk_text, &instr.chunk) || instr.chunk < 0)) {
    return TokenError(token, "expected a chunk number after 'c'");
  }
  return instr;
}

std::string ScheduleToText(const Schedule& schedule) {
  std::string out = Header(schedule) + "\n";
  for (size_t s = 0; s < schedule.per_stage.size(); ++s) {
    absl::StrAppend(&out, "stage", s, ":");
    for (const Instr& instr : schedule.per_stage[s]) {
      absl::StrAppend(&out, " ", FormatInstr(instr, schedule.chunks));
    }
    out += "\n";
  }
  return out;
}

namespace {

// Fills p, m, v from the tokens when the header did not give them.
void InferShape(Schedule* schedule, bool have_header) {
  if (have_header) return;
  schedule->stages = static_cast<int>(schedule->per_stage.size());
  int max_mb = -1, max_chunk = 0;
  for (const auto& stage : schedule->per_stage) {
    for (const Instr& in : stage) {
      max_mb = std::max(max_mb, in.microbatch);
      max_chunk = std::max(max_chunk, in.chunk);
    }
  }
  schedule->microbatches = max_mb + 1;
  schedule->chunks = max_chunk + 1;
}

absl::Status ParseHeader(absl::string_view line, Schedule* schedule) {
  for (absl::string_view field : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(field, '=');
    int value = 0;
    if (kv.first == "kind") {
      absl::StatusOr<ScheduleKind> kind = ParseScheduleKind(kv.second);
      if (!kind.ok()) return kind.status();
      schedule->kind = *kind;
    } else if (kv.first == "stages" || kv.first == "microbatches" || kv.first == "chunks") {
      if (!absl::SimpleAtoi(kv.second, &value) || value < 1) {
        return absl::InvalidArgumentError(absl::StrCat("header: bad ", kv.first, " '",
                                                       kv.second, "'"));
      }
      (kv.first == "stages" ? schedule->stages
       : kv.first == "microbatches" ? schedule->microbatches
                                    : schedule->chunks) = value;
    } else if (kv.first == "placement") {
      absl::StatusOr<Placement> placement = ParsePlacement(kv.second);
      if (!placement.ok()) return placement.status();
      schedule->placement = *placement;
    } else if (kv.first == "sync") {
      absl::StatusOr<StepSync> sync = ParseStepSync(kv.second);
      if (!sync.ok()) return sync.status();
      schedule->step_sync = *sync;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Schedule> ScheduleFromText(absl::string_view text) {
  Schedule schedule;
  bool have_header = false;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    if (absl::ConsumePrefix(&line, "#")) {
      line = absl::StripLeadingAsciiWhitespace(line);
      if (absl::ConsumePrefix(&line, "freeride schedule")) {
        absl::Status status = ParseHeader(line, &schedule);
        if (!status.ok()) return absl::InvalidArgumentError(
            absl::StrCat("line ", line_number, ": ", status.message()));
        have_header = true;
      }
      continue;
    }
    const int stage = static_cast<int>(schedule.per_stage.size());
    const std::string prefix = absl::StrCat("stage", stage, ":");
    if (!absl::ConsumePrefix(&line, prefix)) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_number, ": expected '", prefix, "' to start the line"));
    }
    std::vector<Instr>& instrs = schedule.per_stage.emplace_back();
    for (absl::string_view token : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      absl::StatusOr<Instr> instr = ParseInstr(token, stage);
      if (!instr.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("line ", line_number, ": ", instr.status().message()));
      }
      instrs.push_back(*instr);
    }
  }
  if (schedule.per_stage.empty()) return absl::InvalidArgumentError("no stage lines");
  InferShape(&schedule, have_header);
  return schedule;
}

std::string ScheduleToCsv(const Schedule& schedule) {
  std::string out = Header(schedule) +
                    "\nstage,index,op,chunk,microbatch,buffer,peer,bubble,duration_ms,free_bytes\n";
  for (const auto& stage : schedule.per_stage) {
    for (size_t i = 0; i < stage.size(); ++i) {
      const Instr& in = stage[i];
      absl::StrAppend(&out, in.stage, ",", i, ",", OpName(in.op), ",", in.chunk, ",",
                      in.microbatch, ",", in.buffer, ",", in.peer, ",",
                      in.op == Op::kBubble ? BubbleKindName(in.bubble) : "", ",",
                      absl::StrFormat("%.17g", in.duration_ms), ",", in.free_bytes, "\n");
    }
  }
  return out;
}

absl::StatusOr<Schedule> ScheduleFromCsv(absl::string_view text) {
  Schedule schedule;
  bool have_header = false, have_columns = false;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    auto fail = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("csv line ", line_number, ": ", why));
    };
    if (absl::ConsumePrefix(&line, "#")) {
      line = absl::StripLeadingAsciiWhitespace(line);
      if (absl::ConsumePrefix(&line, "freeride schedule")) {
        absl::Status status = ParseHeader(line, &schedule);
        if (!status.ok()) return fail(status.message());
        have_header = true;
      }
      continue;
    }
    if (!have_columns) {
      if (!absl::StartsWith(line, "stage,index,op")) return fail("expected the column header");
      have_columns = true;
      continue;
    }
    std::vector<std::string> f = absl::StrSplit(line, ',');
    if (f.size() != 10) return fail(absl::StrCat("expected 10 fields, found ", f.size()));
    Instr in;
    int index = 0;
    if (!absl::SimpleAtoi(f[0], &in.stage) || in.stage < 0 || !absl::SimpleAtoi(f[1], &index) ||
        !absl::SimpleAtoi(f[3], &in.chunk) || !absl::SimpleAtoi(f[4], &in.microbatch) ||
        !absl::SimpleAtoi(f[5], &in.buffer) || !absl::SimpleAtoi(f[6], &in.peer) ||
        !absl::SimpleAtod(f[8], &in.duration_ms) || !absl::SimpleAtoi(f[9], &in.free_bytes)) {
      return fail("a numeric field does not parse");
    }
    const OpToken* op = nullptr;
    for (const OpToken& t : kOps) {
      if (f[2] == t.name) op = &t;
    }
    if (op == nullptr) return fail(absl::StrCat("unknown op '", f[2], "'"));
    in.op = op->op;
    if (in.op == Op::kBubble) {
      absl::StatusOr<BubbleKind> kind = ParseBubbleKind(f[7]);
      if (!kind.ok()) return fail(kind.status().message());
      in.bubble = *kind;
    }
    if (in.stage >= static_cast<int>(schedule.per_stage.size())) {
      schedule.per_stage.resize(in.stage + 1);
    }
    auto& stage = schedule.per_stage[in.stage];
    if (index != static_cast<int>(stage.size())) {
      return fail(absl::StrCat("index ", index, " out of order (expected ", stage.size(), ")"));
    }
    stage.push_back(in);
  }
  if (schedule.per_stage.empty()) return absl::InvalidArgumentError("csv: no instructions");
  InferShape(&schedule, have_header);
  return schedule;
}

}  // namespace freeride::pipeline
