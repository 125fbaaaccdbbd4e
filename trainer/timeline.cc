// The measured timeline of a run: a Chrome trace per rank (every instruction of the steps
// trace.steps names, side-task steps on their own track, message flows, counters) and one SVG
// of a recorded step (the last with side tasks running, if any) across all stages, with
// side-task steps drawn inside the bubbles.
#include <filesystem>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/files.h"
#include "pipeline/render.h"
#include "pipeline/simulator.h"
#include "trainer/trainer.h"

namespace freeride {

// The flow event that ties a SEND to its RECV on another rank: both ends compute the same id
// from (step, direction, replica, sending virtual stage, micro-batch). Empty for other ops.
std::string Trainer::FlowEvent(int64_t step, const pipeline::Instr& in, double ts_us) const {
  using pipeline::Op;
  const bool send = in.op == Op::kSendAct || in.op == Op::kSendGrad;
  const bool gradient = in.op == Op::kSendGrad || in.op == Op::kRecvGrad;
  if (!send && in.op != Op::kRecvAct && in.op != Op::kRecvGrad) return "";
  const int64_t V = static_cast<int64_t>(layout_.pp) * layout_.chunks;
  const int64_t vs = VirtualStageOf(in.chunk);
  const int64_t sender = send ? vs : gradient ? vs + 1 : vs - 1;
  const int64_t M = executor_->schedule().microbatches;
  const int64_t id =
      (((step * 2 + (gradient ? 1 : 0)) * layout_.dp + layout_.replica) * V + sender) * M +
      in.microbatch;
  // A flow starts in the slice around its start and ends in the one around its end ("bp": "e").
  return absl::StrFormat(
      "{\"name\": \"%s\", \"cat\": \"message\", \"ph\": \"%s\", %s\"id\": %d, \"pid\": %d, "
      "\"tid\": %d, \"ts\": %.3f}",
      gradient ? "gradient" : "activation", send ? "s" : "f", send ? "" : "\"bp\": \"e\", ", id,
      transport_->rank(), layout_.stage, ts_us);
}

// The recorded steps (trace.steps) as a Chrome trace: one process per rank, one slice per
// instruction (BUBBLE slices named by their kind), side-task steps on a second track, an arrow
// from each SEND to its RECV, and counters of each step's waiting and harvested time. Times are
// the trainer's clock, which ranks on one machine share.
absl::Status Trainer::WriteTimeline() const {
  if (timelines_.empty()) return absl::OkStatus();
  const auto& instrs = executor_->instructions();
  const int rank = transport_->rank();
  std::vector<std::string> events;
  for (size_t k = 0; k < timelines_.size(); ++k) {
    const auto& [step, timeline] = timelines_[k];
    if (timeline.empty()) continue;
    const double t0 = timeline_starts_[k], t1 = t0 + timeline.back().end_s;
    double harvested_s = 0;
    if (side_) {
      // Side-task steps of this step's window, on the rank's second track.
      const HarvestReport report = side_->Report();
      for (const SideStepEvent& e : side_->events()) {
        if (e.start_s < t0 || e.start_s > t1) continue;
        harvested_s += e.end_s - e.start_s;
        events.push_back(absl::StrFormat(
            "{\"name\": \"%s\", \"cat\": \"side_task\", \"ph\": \"X\", \"pid\": %d, "
            "\"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, \"args\": {\"step\": %d}}",
            report.tasks[e.task].name, rank, layout_.stage + 1000, e.start_s * 1e6,
            (e.end_s - e.start_s) * 1e6, step));
      }
    }
    events.push_back(absl::StrFormat(
        "{\"name\": \"time per step (ms)\", \"ph\": \"C\", \"pid\": %d, \"ts\": %.3f, "
        "\"args\": {\"waiting\": %.3f, \"harvested\": %.3f}}",
        rank, t0 * 1e6, timeline_bubble_s_[k] * 1e3, harvested_s * 1e3));
    for (const pipeline::InstrTiming& t : timeline) {
      // A BUBBLE is named by the prediction it began that step with (the side-task executor
      // corrects them step by step), else by the schedule's.
      pipeline::Instr in = instrs[t.index];
      if (k < timeline_predicted_.size()) {
        if (auto it = timeline_predicted_[k].find(t.index); it != timeline_predicted_[k].end()) {
          in.duration_ms = it->second;
        }
      }
      events.push_back(absl::StrFormat(
          "{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, "
          "\"ts\": %.3f, \"dur\": %.3f, \"args\": {\"step\": %d}}",
          pipeline::FormatInstr(in, layout_.chunks), pipeline::OpName(in.op), rank, layout_.stage,
          (t0 + t.start_s) * 1e6, (t.end_s - t.start_s) * 1e6, step));
      // Emulated peers record no slices for a flow to end in.
      if (!config_.runtime.emulate_peers) {
        std::string flow = FlowEvent(step, in, (t0 + (t.start_s + t.end_s) / 2) * 1e6);
        if (!flow.empty()) events.push_back(std::move(flow));
      }
    }
    if (k + 1 == timelines_.size()) {  // the counters end with the last step
      events.push_back(absl::StrFormat(
          "{\"name\": \"time per step (ms)\", \"ph\": \"C\", \"pid\": %d, \"ts\": %.3f, "
          "\"args\": {\"waiting\": 0, \"harvested\": 0}}",
          rank, t1 * 1e6));
    }
  }
  const std::string json = absl::StrFormat(
      "{\"traceEvents\": [\n%s\n], \"displayTimeUnit\": \"ms\", \"otherData\": {\"rank\": %d, "
      "\"stage\": %d, \"replica\": %d}}\n",
      absl::StrJoin(events, ",\n"), rank, layout_.stage, layout_.replica);
  return WriteFileAtomically(
      (std::filesystem::path(config_.run.dir) / absl::StrFormat("timeline_rank%03d.json", rank))
          .string(),
      json);
}

absl::Status Trainer::WriteTimelineSvg() {
  // Gather that step of replica 0 to rank 0: every rank knows the whole
  // schedule, so each fills its own stage's slice of fixed-size buffers and a sum joins them.
  const pipeline::Schedule& schedule = executor_->schedule();
  constexpr int kMaxSideSteps = 4096;
  std::vector<int64_t> offset(layout_.pp + 1, 0);
  for (int st = 0; st < layout_.pp; ++st) {
    offset[st + 1] = offset[st] + static_cast<int64_t>(schedule.per_stage[st].size());
  }
  // The last recorded step in which side steps ran on some rank, else the last that could
  // harvest, else the last: a study's recorded steps end in blocks without side tasks (its A/A
  // and plain arms), where a picture of harvesting shows none. Every rank counts its own side
  // steps, and a sum makes them agree on the step (the gather below is collective).
  size_t pick = timelines_.empty() ? 0 : timelines_.size() - 1;
  for (size_t k = 0; k < timelines_.size(); ++k) {
    if (timeline_harvested_[k]) pick = k;
  }
  if (!timelines_.empty()) {
    std::vector<double> side_steps(timelines_.size(), 0.0);
    for (size_t k = 0; side_ && k < timelines_.size(); ++k) {
      const double t0 = timeline_starts_[k];
      const double t1 = t0 + (timelines_[k].second.empty() ? 0 : timelines_[k].second.back().end_s);
      for (const SideStepEvent& e : side_->events())
        side_steps[k] += e.start_s >= t0 && e.start_s <= t1;
    }
    absl::Status s =
        transport_->AllReduceSum(side_steps.data(), static_cast<int64_t>(side_steps.size()),
                                 transport_->AllRanks(), config_.runtime.comm_timeout_s);
    if (!s.ok()) return s;
    for (size_t k = 0; k < timelines_.size(); ++k) {
      if (side_steps[k] > 0) pick = k;
    }
  }
  std::vector<double> times(3 * offset[layout_.pp], 0.0);
  std::vector<double> side(static_cast<size_t>(layout_.pp) * (1 + 2 * kMaxSideSteps), 0.0);
  if (layout_.replica == 0 && !timelines_.empty()) {
    for (const pipeline::InstrTiming& t : timelines_[pick].second) {
      const int64_t k = 3 * (offset[layout_.stage] + t.index);
      times[k] = t.start_s * 1e3, times[k + 1] = t.end_s * 1e3, times[k + 2] = t.wait_end_s * 1e3;
    }
    if (side_) {
      const double t0 = timeline_starts_[pick];
      const double t1 = t0 + timelines_[pick].second.back().end_s;
      double* mine = side.data() + layout_.stage * (1 + 2 * kMaxSideSteps);
      int n = 0;
      for (const SideStepEvent& e : side_->events()) {
        if (e.start_s < t0 || e.start_s > t1 || n == kMaxSideSteps) continue;
        mine[1 + 2 * n] = (e.start_s - t0) * 1e3, mine[2 + 2 * n] = (e.end_s - t0) * 1e3;
        ++n;
      }
      mine[0] = n;
    }
  }
  const std::vector<int> world = transport_->AllRanks();
  for (std::vector<double>* v : {&times, &side}) {
    absl::Status s = transport_->AllReduceSum(v->data(), static_cast<int64_t>(v->size()), world,
                                              config_.runtime.comm_timeout_s);
    if (!s.ok()) return s;
  }
  if (!leader() || timelines_.empty()) return absl::OkStatus();
  // The measurement in the simulator's shape, so the schedule pictures' renderer draws it.
  pipeline::SimResult sim;
  double bubble_total = 0;
  for (int st = 0; st < layout_.pp; ++st) {
    pipeline::StageResult r;
    r.stage = st;
    const auto& instrs = schedule.per_stage[st];
    for (size_t i = 0; i < instrs.size(); ++i) {
      r.start.push_back(times[3 * (offset[st] + i)]);
      r.end.push_back(times[3 * (offset[st] + i) + 1]);
      sim.step_time = std::max(sim.step_time, r.end.back());
    }
    for (size_t i = 0; i < instrs.size(); ++i) {
      if (instrs[i].op != pipeline::Op::kBubble) continue;
      size_t j = i + 1;
      while (j < instrs.size() && instrs[j].op == pipeline::Op::kBubble) ++j;
      if (j == instrs.size()) continue;
      const double wait_end = times[3 * (offset[st] + j) + 2];
      const double end = wait_end > 0 ? wait_end : r.end[j];
      pipeline::BubbleSpan span;
      span.kind = instrs[i].bubble;
      span.start = r.start[i];
      span.duration = std::max(0.0, end - span.start);
      span.before_index = static_cast<int>(j);
      r.bubbles.push_back(span);
      r.bubble += span.duration;
    }
    bubble_total += r.bubble;
    sim.stages.push_back(std::move(r));
  }
  sim.bubble_fraction = sim.step_time > 0 ? bubble_total / (layout_.pp * sim.step_time) : 0;
  std::vector<std::vector<std::pair<double, double>>> steps(layout_.pp);
  for (int st = 0; st < layout_.pp; ++st) {
    const double* slice = side.data() + st * (1 + 2 * kMaxSideSteps);
    for (int n = 0; n < static_cast<int>(slice[0]); ++n) {
      steps[st].emplace_back(slice[1 + 2 * n], slice[2 + 2 * n]);
    }
  }
  const std::string title = absl::StrFormat(
      "measured step %d: %s, p=%d, m=%d; %.1f ms, waiting %.1f%% of stage time%s",
      timelines_[pick].first, config_.parallel.schedule, layout_.pp, schedule.microbatches,
      sim.step_time, 100 * sim.bubble_fraction, side_ ? "; bars: side-task steps" : "");
  // An emulated run measured one stage; the others' rows say so instead of looking broken.
  std::vector<std::string> notes(layout_.pp);
  if (config_.runtime.emulate_peers) {
    for (int st = 0; st < layout_.pp; ++st) {
      if (st != layout_.stage) {
        notes[st] =
            "emulated (runtime.emulate_peers): this process stood in for the stage's "
            "messages, nothing ran here to measure";
      }
    }
  }
  return WriteFileAtomically(
      (std::filesystem::path(config_.run.dir) / "timeline.svg").string(),
      pipeline::GanttSvg(schedule, sim, side_ ? &steps : nullptr, title, &notes));
}

}  // namespace freeride
