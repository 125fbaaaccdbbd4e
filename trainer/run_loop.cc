// The training loop a run executes: steps with their metrics and log lines, validation,
// periodic checkpoints, and what ends a run early: a stop request (signal) or a step whose
// loss or gradient norm is not finite.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/files.h"
#include "core/json_string.h"
#include "core/logging.h"
#include "core/stop_request.h"
#include "trainer/jobs/job_runner.h"
#include "trainer/pipeline_plan.h"
#include "trainer/trainer.h"

namespace freeride {
namespace {

std::string FormatDuration(double seconds) {
  if (seconds < 60) return absl::StrFormat("%.0fs", seconds);
  if (seconds < 3600) return absl::StrFormat("%dm%02ds", int(seconds) / 60, int(seconds) % 60);
  return absl::StrFormat("%dh%02dm", int(seconds) / 3600, int(seconds) / 60 % 60);
}

// The number under `key` in a metrics row, or -1 for a row without one.
double RowNumber(const std::string& line, const std::string& key) {
  const std::string field = "\"" + key + "\": ";
  const size_t at = line.find(field);
  if (at == std::string::npos) return -1;
  double value = -1;
  const size_t from = at + field.size(), to = line.find_first_of(",}", from);
  return absl::SimpleAtod(line.substr(from, to - from), &value) ? value : -1;
}

// A JSON list of per-stage byte counts.
std::string Bytes(const std::vector<double>& bytes) {
  std::vector<std::string> out;
  for (double b : bytes) out.push_back(absl::StrFormat("%.0f", b));
  return absl::StrJoin(out, ", ");
}

}  // namespace

absl::Status Trainer::TrimMetricsAfterResume() {
  const std::string path = (std::filesystem::path(config_.run.dir) / "metrics.jsonl").string();
  if (!std::filesystem::exists(path)) return absl::OkStatus();
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  std::istringstream in(*text);
  std::string line, kept;
  int64_t dropped = 0;
  while (std::getline(in, line)) {
    // A row cut short by a kill (no closing brace) is dropped with the later ones.
    if (RowNumber(line, "step") > static_cast<double>(step_) || line.empty() ||
        line.back() != '}') {
      ++dropped;
      continue;
    }
    kept += line + "\n";
    if (absl::StrContains(line, "\"kind\": \"train\"")) {
      elapsed_before_s_ = std::max(elapsed_before_s_, RowNumber(line, "elapsed_s"));
    }
  }
  if (dropped == 0) return absl::OkStatus();
  FR_LOG(INFO) << "metrics.jsonl: dropped " << dropped << " rows of steps after " << step_
               << " (written after the checkpoint by the run that stopped)";
  return WriteFileAtomically(path, kept);
}

void Trainer::StartMetrics() {
  run_start_s_ = ClockOr(clock_).Now();
  if (!leader()) return;
  peak_ = ResolvePeakFlops(config_, chunks_[0]->Describe(), ClockOr(clock_).simulated());
  const int64_t devices = config_.parallel.pp * config_.parallel.dp;
  if (peak_.per_device > 0) {
    FR_LOG(INFO) << absl::StrFormat("mfu: against %.4g TFLOP/s per device × %d devices (%s)",
                                    peak_.per_device / 1e12, devices, peak_.source);
  } else {
    FR_LOG(INFO) << "mfu: none (" << peak_.source << ")";
  }
  WriteMetric(absl::StrFormat(
      "{\"kind\": \"start\", \"step\": %d, \"time\": \"%s\", \"devices\": %d, "
      "\"peak_flops_per_device\": %s, \"peak_flops_source\": %s, \"flops_per_step\": %.6e}",
      step_, Iso8601Utc(std::chrono::system_clock::now()), devices,
      peak_.per_device > 0 ? absl::StrFormat("%.6e", peak_.per_device) : "null",
      JsonString(peak_.source), FlopsPerStep()));
}

double Trainer::FlopsPerStep() const {
  const TrainConfig& tc = config_.train;
  return flops_per_token_ * static_cast<double>(tc.batch_size * layout_.dp * tc.seq_len);
}

double Trainer::Mfu(double step_s) {
  // Model FLOPs over what every device of the pipeline could have done in the step.
  const int64_t devices = config_.parallel.pp * config_.parallel.dp;
  const double capacity = step_s * peak_.per_device * static_cast<double>(devices);
  if (capacity <= 0) return NAN;
  const double mfu = FlopsPerStep() / capacity;
  if (mfu <= 1) return mfu;
  if (!above_peak_said_) {
    above_peak_said_ = true;
    FR_LOG(WARN) << absl::StrFormat(
        "mfu: not reported: a step ran at %.4g TFLOP/s per device, above the peak of %.4g (%s); "
        "the peak is unreliable: set runtime.peak_tflops",
        FlopsPerStep() / step_s / static_cast<double>(devices) / 1e12, peak_.per_device / 1e12,
        peak_.source);
  }
  return NAN;
}

absl::Status Trainer::WriteTrainMetric(const StepStats& s) {
  std::vector<std::string> bubbles;
  for (double b : s.bubble_s) bubbles.push_back(absl::StrFormat("%.6f", b));
  auto number = [](double v, int digits) {
    return std::isfinite(v) ? absl::StrFormat("%.*f", digits, v) : std::string("null");
  };
  const double elapsed = elapsed_before_s_ + ClockOr(clock_).Now() - run_start_s_;
  const TrainConfig& tc = config_.train;
  WriteMetric(absl::StrFormat(
      "{\"kind\": \"train\", \"step\": %d, \"loss\": %s, \"lr\": %.6e, \"grad_norm\": %s, "
      "\"step_s\": %.6f, \"tokens_per_s\": %.1f, \"bubble_s\": [%s], \"time\": \"%s\", "
      "\"elapsed_s\": %.3f, \"tokens\": %d, \"harvesting\": %s, \"mfu\": %s, "
      "\"host_peak_bytes\": [%s]%s%s}",
      s.step, number(s.loss, 6), s.lr, number(s.grad_norm, 6), s.step_s, s.tokens_per_s,
      absl::StrJoin(bubbles, ", "), Iso8601Utc(std::chrono::system_clock::now()), elapsed,
      s.step * tc.batch_size * layout_.dp * tc.seq_len, s.harvesting ? "true" : "false",
      number(Mfu(s.step_s), 6), Bytes(s.host_peak_bytes),
      config_.runtime.device == "cuda"
          ? absl::StrFormat(", \"device_bytes\": [%s]", Bytes(s.device_bytes))
          : "",
      s.applied ? "" : ", \"nonfinite\": true, \"applied\": false"));
  // One record per BUBBLE run with side tasks: what was predicted when it began and what it
  // was; the errors feed the harvest report.
  constexpr int K = pipeline::kNumBubbleKinds;
  if (prediction_errors_.empty()) prediction_errors_.resize(static_cast<size_t>(layout_.pp) * K);
  for (const BubbleRecord& b : s.bubbles) {
    const bool known = b.predicted_s > 0;
    WriteMetric(absl::StrFormat(
        "{\"kind\": \"bubble\", \"step\": %d, \"stage\": %d, \"index\": %d, \"anchor\": %d, "
        "\"bubble_kind\": \"%s\", \"predicted_s\": %s, \"measured_s\": %.6f, "
        "\"harvested_s\": %.6f}",
        s.step, b.stage, b.index, b.anchor, pipeline::BubbleKindName(b.kind),
        known ? absl::StrFormat("%.6f", b.predicted_s) : "null", b.measured_s, b.harvested_s));
    if (known) {
      prediction_errors_[b.stage * K + static_cast<int>(b.kind)].push_back(
          std::abs(b.predicted_s - b.measured_s));
    }
  }
  return absl::OkStatus();
}

absl::Status Trainer::StopAfterSignal(int64_t total) {
  const int signal_number = StopRequestedBy();
  const std::string by =
      signal_number != 0 ? StopSignalName(signal_number) : "a signal to another rank";
  if (jobs_) {
    if (absl::Status s = jobs_->Finish(step_, absl::StrFormat("queued again: the training "
                                                              "stopped after step %d",
                                                              step_));
        !s.ok()) {
      return s;
    }
  }
  if (side_) side_->Finish();
  if (config_.freeride.enabled) {
    if (absl::Status s = ReportHarvest(); !s.ok()) return s;
  }
  std::string where = "no checkpoint (runtime.emulate_peers runs one stage of the model)";
  if (!config_.runtime.emulate_peers) {
    absl::StatusOr<std::string> dir = SaveCheckpoint();
    if (!dir.ok()) return dir.status();
    where = "checkpoint " + *dir;
  }
  return absl::CancelledError(absl::StrFormat(
      "stopped by %s after step %d of %d; %s; to continue, run the same command with "
      "--set checkpoint.resume=latest",
      by, step_, total, where));
}

absl::Status Trainer::Run() {
  absl::Status s = RunSteps();
  // `freeride train` ends a failed MPI job at once (MPI_Abort), which would cut the checkpoint
  // in flight short and leave step_N.partial: it is completed first (the step it holds was
  // applied; the failure came after).
  if (!s.ok() && !absl::IsCancelled(s)) {
    if (absl::Status w = checkpoint_writer_.Wait(); !w.ok()) {
      FR_LOG(WARN) << "the checkpoint being written when the run failed: " << w.message();
    }
  }
  return s;
}

absl::Status Trainer::RunSteps() {
  const bool leader = this->leader();
  const int64_t total = config_.train.steps;
  if (step_ > total) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the checkpoint resumed from is at step %d, past train.steps = %d: nothing to train "
        "(raise train.steps to continue the run)",
        step_, total));
  }
  if (leader) {
    const std::string path = (std::filesystem::path(config_.run.dir) / "metrics.jsonl").string();
    if (absl::Status s = MakeDirectories(config_.run.dir); !s.ok()) return s;
    if (step_ > 0) {
      if (absl::Status s = TrimMetricsAfterResume(); !s.ok()) return s;
    }
    metrics_.open(path, step_ > 0 ? std::ios::app : std::ios::trunc);
    if (!metrics_) return absl::InternalError("cannot write " + path);
    if (config_.run.tensorboard) {
      absl::StatusOr<std::unique_ptr<TensorBoardWriter>> writer = TensorBoardWriter::Open(
          (std::filesystem::path(config_.run.dir) / "tensorboard").string(), step_);
      if (!writer.ok()) return writer.status();
      tensorboard_ = *std::move(writer);
    }
  }
  if (resumed_ && step_ == total) {
    if (leader) {
      FR_LOG(INFO) << "the checkpoint is at step " << step_ << " = train.steps: nothing to train";
    }
    return absl::OkStatus();
  }
  StartMetrics();
  const GPT2Config& c = model_config_;
  FR_LOG(INFO) << absl::StrFormat(
      "model: %d layers, %d heads, width %d, vocab %d (padded %d), %d parameters; batch %d x %d "
      "tokens in %d micro-batches; pp %d x dp %d, %s schedule%s; this rank: stage %d, %d "
      "parameters on %s, recompute %s; %d train tokens; %d threads",
      c.n_layer, c.n_head, c.n_embd, c.vocab_size, c.padded_vocab_size, NumParameters(c),
      config_.train.batch_size, config_.train.seq_len, config_.train.microbatches, layout_.pp,
      layout_.dp, config_.parallel.schedule,
      layout_.chunks > 1 ? absl::StrFormat(" (%d chunks)", layout_.chunks) : "", layout_.stage,
      chunks_[0]->num_params(), chunks_[0]->Describe(),
      RecomputeName(StageRecompute(config_, layout_.stage)), train_->total_tokens(),
      omp_get_max_threads());
  const bool checkpoints = !config_.runtime.emulate_peers;
  if (!checkpoints && leader) {
    FR_LOG(INFO) << "runtime.emulate_peers: this process holds one stage of the model, so the "
                    "run writes no checkpoint";
  }
  const auto evaluate = [&]() -> absl::Status {
    if (!val_ || config_.eval.every == 0) return absl::OkStatus();
    absl::StatusOr<double> val = Evaluate();
    if (!val.ok()) return val.status();
    if (leader) {
      FR_LOG(PROGRESS) << absl::StrFormat("step %d | val loss %.4f", step_, *val);
    }
    WriteMetric(absl::StrFormat("{\"kind\": \"val\", \"step\": %d, \"loss\": %s}", step_,
                                std::isfinite(*val) ? absl::StrFormat("%.6f", *val) : "null"));
    return absl::OkStatus();
  };
  if (step_ == 0) {
    if (absl::Status s = evaluate(); !s.ok()) return s;
  }
  double elapsed = 0;
  int64_t timed = 0;
  while (step_ < total) {
    absl::StatusOr<StepStats> step = Step();
    if (!step.ok()) return step.status();
    const StepStats& s = *step;
    if (absl::Status w = WriteTrainMetric(s); !w.ok()) return w;
    if (!s.applied) {
      ++nonfinite_in_row_;
      const bool skip = config_.optim.on_nonfinite == "skip" &&
                        nonfinite_in_row_ < config_.optim.max_nonfinite_skips;
      const std::string what = absl::StrFormat(
          "step %d: loss %g, gradient norm %g: not finite, so the update was not applied", s.step,
          s.loss, s.grad_norm);
      if (!skip) {
        return absl::InternalError(absl::StrFormat(
            "%s; stopping (optim.on_nonfinite = \"%s\"%s). The weights are those after step %d; "
            "lower optim.lr or set optim.grad_clip, then resume from the last checkpoint",
            what, config_.optim.on_nonfinite,
            config_.optim.on_nonfinite == "skip"
                ? absl::StrFormat(", %d in a row", nonfinite_in_row_) : "",
            s.step - 1));
      }
      if (leader) {
        FR_LOG(WARN) << what << " (skipped, " << nonfinite_in_row_ << " in a row)";
      }
    } else {
      nonfinite_in_row_ = 0;
    }
    // The first step warms caches and thread pools: leave it out of the ETA.
    if (s.step > 1 || total == 1) elapsed += s.step_s, ++timed;
    const double eta = timed > 0 ? elapsed / timed * static_cast<double>(total - s.step) : 0;
    if (leader && s.applied && (s.step % config_.run.log_every == 0 || s.step == total)) {
      FR_LOG(PROGRESS) << absl::StrFormat(
          "step %*d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f ms | %.0f tok/s%s | eta %s",
          static_cast<int>(std::to_string(total).size()), s.step, total, s.loss, s.lr, s.grad_norm,
          s.step_s * 1e3, s.tokens_per_s,
          std::isfinite(Mfu(s.step_s)) ? absl::StrFormat(" | mfu %.1f%%", 100 * Mfu(s.step_s)) : "",
          FormatDuration(eta));
    }
    if (config_.eval.every > 0 && (s.step % config_.eval.every == 0 || s.step == total)) {
      if (absl::Status e = evaluate(); !e.ok()) return e;
    }
    if (s.stop_requested && s.step < total) return StopAfterSignal(total);
    if (checkpoints && config_.checkpoint.every > 0 && s.step % config_.checkpoint.every == 0 &&
        s.step < total) {
      absl::StatusOr<std::string> dir = SaveCheckpoint(config_.checkpoint.background);
      if (!dir.ok()) return dir.status();
    }
  }
  if (jobs_) {
    if (absl::Status s = jobs_->Finish(step_, absl::StrFormat("queued again: the training "
                                                              "ended at step %d first",
                                                              step_));
        !s.ok()) {
      return s;
    }
  }
  if (config_.freeride.enabled) {
    if (side_) side_->Finish();
    if (absl::Status s = ReportHarvest(); !s.ok()) return s;
  }
  if (absl::Status s = WriteTimeline(); !s.ok()) return s;
  if (absl::Status s = WriteTimelineSvg(); !s.ok()) return s;
  if (checkpoints) {
    absl::StatusOr<std::string> dir = SaveCheckpoint();
    if (!dir.ok()) return dir.status();
    if (leader) {
      FR_LOG(PROGRESS) << "final checkpoint " << *dir << " (model.bin is an llm.c checkpoint)";
    }
  }
  return absl::OkStatus();
}

}  // namespace freeride
