#include "pipeline/render.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace freeride::pipeline {
namespace {

std::string Num(double v) { return absl::StrFormat("%.6g", v); }

const char* Category(Op op) {
  switch (op) {
    case Op::kForward: return "forward";
    case Op::kBackward: return "backward";
    case Op::kBackwardInput: return "backward_input";
    case Op::kBackwardWeight: return "backward_weight";
    case Op::kOptimizer: return "optimizer";
    case Op::kBubble: return "bubble";
    default: return "comm";
  }
}

const char* OpColour(Op op) {
  switch (op) {
    case Op::kForward: return "#4a86e8";
    case Op::kBackward: return "#6aa84f";
    case Op::kBackwardInput: return "#93c47d";
    case Op::kBackwardWeight: return "#8e7cc3";
    case Op::kOptimizer: return "#999999";
    default: return "#cccccc";
  }
}

const char* BubbleColour(BubbleKind kind) {
  switch (kind) {
    case BubbleKind::kWarmup: return "#f4cccc";
    case BubbleKind::kFill: return "#fce5cd";
    case BubbleKind::kSteady: return "#fff2cc";
    case BubbleKind::kCooldown: return "#d9d2e9";
    case BubbleKind::kSync: return "#d0e0e3";
    default: return "#ffffff";
  }
}

}  // namespace

std::string SummaryJson(const Schedule& s, const SimResult& sim) {
  std::string out = absl::StrFormat(
      "{\"kind\":\"%s\",\"stages\":%d,\"microbatches\":%d,\"chunks\":%d,\"step_time\":%s,"
      "\"bubble_fraction\":%s,\"schedule_bubble\":%s,\"placement\":\"%s\","
      "\"step_sync\":\"%s\",\"per_stage\":[",
      ScheduleKindName(s.kind), s.stages, s.microbatches, s.chunks, Num(sim.step_time),
      Num(sim.bubble_fraction), Num(sim.schedule_bubble), PlacementName(s.placement),
      StepSyncName(s.step_sync));
  for (size_t st = 0; st < sim.stages.size(); ++st) {
    const StageResult& r = sim.stages[st];
    absl::StrAppend(&out, st ? "," : "", "{\"stage\":", r.stage, ",\"busy\":", Num(r.busy),
                    ",\"bubble\":", Num(r.bubble), ",\"span_bubble\":", Num(r.span_bubble),
                    ",\"peak_activations\":", r.peak_activations, ",\"bubbles\":[");
    for (size_t b = 0; b < r.bubbles.size(); ++b) {
      absl::StrAppend(&out, b ? "," : "", "{\"kind\":\"", BubbleKindName(r.bubbles[b].kind),
                      "\",\"start\":", Num(r.bubbles[b].start), ",\"duration\":",
                      Num(r.bubbles[b].duration), "}");
    }
    out += "]}";
  }
  return out + "]}\n";
}

std::string SummaryText(const Schedule& s, const SimResult& sim) {
  std::string out = absl::StrFormat(
      "%s: p=%d m=%d v=%d  step %s ms%s  bubble fraction %.4f\n", ScheduleKindName(s.kind),
      s.stages, s.microbatches, s.chunks, Num(sim.step_time),
      s.step_sync == StepSync::kPostValidate ? " (post-validated: steady period)" : "",
      sim.bubble_fraction);
  absl::StrAppend(&out, absl::StrFormat("%-6s %10s %10s %9s %9s %9s %9s %9s %8s\n", "stage",
                                        "busy", "bubble", "warmup", "fill", "steady", "cooldown",
                                        "sync", "bubbles"));
  for (const StageResult& r : sim.stages) {
    const auto& k = r.bubble_by_kind;
    absl::StrAppend(&out, absl::StrFormat("%-6d %10.4g %10.4g %9.4g %9.4g %9.4g %9.4g %9.4g %8d\n",
                                          r.stage, r.busy, r.bubble, k[1], k[2], k[3], k[4], k[5],
                                          r.bubbles.size()));
  }
  return out;
}

std::string ChromeTrace(const Schedule& s, const SimResult& sim) {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  auto event = [&](const std::string& e) {
    absl::StrAppend(&out, first ? "" : ",\n", e);
    first = false;
  };
  for (int st = 0; st < s.stages; ++st) {
    event(absl::StrFormat("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
                          "\"args\":{\"name\":\"stage %d\"}}", st, st));
    const auto& instrs = s.per_stage[st];
    const StageResult& r = sim.stages[st];
    for (size_t i = 0; i < instrs.size(); ++i) {
      const Instr& in = instrs[i];
      if (!IsCompute(in.op) && in.op != Op::kOptimizer) continue;
      event(absl::StrFormat(
          "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,\"ts\":%s,"
          "\"dur\":%s,\"args\":{\"microbatch\":%d,\"chunk\":%d,\"buffer\":%d}}",
          FormatInstr(in, s.chunks), Category(in.op), st, Num(r.start[i] * 1e3),
          Num((r.end[i] - r.start[i]) * 1e3), in.microbatch, in.chunk, in.buffer));
    }
    for (const BubbleSpan& b : r.bubbles) {
      const std::string waits =
          b.before_index < static_cast<int>(instrs.size())
              ? FormatInstr(instrs[b.before_index], s.chunks) : "step end";
      event(absl::StrFormat(
          "{\"name\":\"BUBBLE(%s)\",\"cat\":\"bubble\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,"
          "\"ts\":%s,\"dur\":%s,\"cname\":\"grey\",\"args\":{\"kind\":\"%s\",\"waits_for\":\"%s\","
          "\"free_bytes\":%d}}",
          BubbleKindName(b.kind), st, Num(b.start * 1e3), Num(b.duration * 1e3),
          BubbleKindName(b.kind), waits, b.free_bytes));
    }
  }
  return out + "\n]}\n";
}

std::string GanttSvg(const Schedule& s, const SimResult& sim,
                     const std::vector<std::vector<std::pair<double, double>>>* side_steps,
                     const std::string& title, const std::vector<std::string>* row_notes) {
  const double label = 70, right = 20, top = 36, row = 26, gap = 6;
  // Wide enough for the legend (nine entries, plus the side-task bar when drawn).
  const double width = std::max(std::clamp(200.0 + 14.0 * s.microbatches * s.chunks * 3, 900.0,
                                           2400.0),
                                side_steps != nullptr ? 1080.0 : 960.0);
  // Post-validated steps overlap: a later stage's step reaches past the period.
  double extent = sim.step_time;
  for (const StageResult& r : sim.stages) {
    if (!r.end.empty()) extent = std::max(extent, *std::max_element(r.end.begin(), r.end.end()));
  }
  const double scale = extent > 0 ? (width - label - right) / extent : 1;
  const double legend_y = top + s.stages * (row + gap) + 14;
  const double height = legend_y + 40;
  std::string out = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%.0f\" y=\"20\" font-size=\"14\">%s</text>\n",
      width, height, label,
      title.empty() ? absl::StrFormat("%s schedule: p=%d, m=%d, v=%d; step %s ms, bubble "
                                      "fraction %.3f",
                                      ScheduleKindName(s.kind), s.stages, s.microbatches,
                                      s.chunks, Num(sim.step_time), sim.bubble_fraction)
                    : title);
  for (int st = 0; st < s.stages; ++st) {
    const double y = top + st * (row + gap);
    absl::StrAppend(&out, absl::StrFormat("<text x=\"6\" y=\"%.1f\">stage %d</text>\n",
                                          y + row * 0.65, st));
    if (row_notes != nullptr && st < static_cast<int>(row_notes->size()) &&
        !(*row_notes)[st].empty()) {
      absl::StrAppend(&out, absl::StrFormat("<text x=\"%.0f\" y=\"%.1f\" fill=\"#666666\" "
                                            "font-style=\"italic\">%s</text>\n",
                                            label + 8, y + row * 0.65, (*row_notes)[st]));
    }
    const StageResult& r = sim.stages[st];
    for (const BubbleSpan& b : r.bubbles) {
      absl::StrAppend(&out, absl::StrFormat(
          "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.0f\" fill=\"%s\" "
          "stroke=\"#bbbbbb\" stroke-dasharray=\"2,2\"><title>BUBBLE(%s, %s ms)</title></rect>\n",
          label + b.start * scale, y, b.duration * scale, row, BubbleColour(b.kind),
          BubbleKindName(b.kind), Num(b.duration)));
    }
    const auto& instrs = s.per_stage[st];
    for (size_t i = 0; i < instrs.size(); ++i) {
      const Instr& in = instrs[i];
      const double w = (r.end[i] - r.start[i]) * scale;
      if ((!IsCompute(in.op) && in.op != Op::kOptimizer) || w <= 0) continue;
      const std::string token = FormatInstr(in, s.chunks);
      const double x = label + r.start[i] * scale;
      absl::StrAppend(&out, absl::StrFormat(
          "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.0f\" fill=\"%s\" "
          "stroke=\"white\" stroke-width=\"0.5\"><title>%s</title></rect>\n",
          x, y, w, row, OpColour(in.op), token));
      if (w >= 7.0 * token.size()) {
        absl::StrAppend(&out, absl::StrFormat(
            "<text x=\"%.2f\" y=\"%.1f\" fill=\"white\" text-anchor=\"middle\">%s</text>\n",
            x + w / 2, y + row * 0.65, token));
      }
    }
    if (side_steps != nullptr && st < static_cast<int>(side_steps->size())) {
      for (const auto& [start, end] : (*side_steps)[st]) {
        absl::StrAppend(&out, absl::StrFormat(
            "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.0f\" fill=\"#222222\">"
            "<title>side task step</title></rect>\n",
            label + start * scale, y + row - 7, std::max(0.5, (end - start) * scale), 6.0));
      }
    }
  }
  struct Entry { const char* name; const char* colour; };
  const Entry legend[] = {
      {"F forward", OpColour(Op::kForward)}, {"B backward", OpColour(Op::kBackward)},
      {"I input grad", OpColour(Op::kBackwardInput)}, {"W weight grad", OpColour(Op::kBackwardWeight)},
      {"warmup", BubbleColour(BubbleKind::kWarmup)}, {"fill", BubbleColour(BubbleKind::kFill)},
      {"steady", BubbleColour(BubbleKind::kSteady)}, {"cooldown", BubbleColour(BubbleKind::kCooldown)},
      {"sync", BubbleColour(BubbleKind::kSync)}};
  double x = label;
  for (const Entry& e : legend) {
    absl::StrAppend(&out, absl::StrFormat(
        "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"14\" fill=\"%s\" stroke=\"#888888\"/>"
        "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n", x, legend_y, e.colour, x + 18, legend_y + 11,
        e.name));
    x += 30 + 7 * std::string(e.name).size();
  }
  if (side_steps != nullptr) {
    absl::StrAppend(&out, absl::StrFormat(
        "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"6\" fill=\"#222222\"/>"
        "<text x=\"%.0f\" y=\"%.0f\">side task step</text>\n", x, legend_y + 8, x + 18,
        legend_y + 11));
  }
  return out + "</svg>\n";
}

}  // namespace freeride::pipeline
