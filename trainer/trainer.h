// Training on the CPU backend, one rank of a PP × DP grid (one process alone is the 1 × 1 case
// of the same code path): the rank's model chunks, its schedule run by the StageExecutor,
// the optimizer step with the global gradient norm, validation, checkpoints, resume, metrics
// and the measured timeline.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/clock.h"
#include "freeride/executor.h"
#include "models/gpt2.h"
#include "pipeline/comm/transport.h"
#include "pipeline/cost_model.h"
#include "pipeline/stage_executor.h"
#include "trainer/checkpoint_writer.h"
#include "trainer/config/config.h"
#include "trainer/data/token_shards.h"
#include "trainer/optimizer.h"
#include "trainer/overhead_guard.h"
#include "trainer/rank_memory.h"
#include "trainer/run_metrics.h"
#include "trainer/step_exchange.h"
#include "trainer/study_stats.h"
#include "trainer/tensorboard.h"

namespace freeride {

class JobRunner;

struct StepStats {
  int64_t step = 0;  // 1-based: the step just completed
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double step_s = 0;
  double tokens_per_s = 0;
  std::vector<double> bubble_s;  // per stage (replica 0), measured waiting time
  // With side tasks: every stage's BUBBLEs of this step (replica 0), in schedule order.
  std::vector<BubbleRecord> bubbles;
  // False when the loss or gradient norm was not finite: the update was not applied.
  bool applied = true;
  // Some rank was asked to stop (a signal) before this step ended: every rank stops after it.
  bool stop_requested = false;
  // Side tasks could run in this step's bubbles (freeride.enabled, in a harvesting block).
  bool harvesting = false;
  // Per stage (replica 0): its process's peak resident set and its chunks' device memory.
  std::vector<double> host_peak_bytes, device_bytes;
};

// The model shape a config asks for. With model.init_from set, the checkpoint's header rules
// and every model key the config sets explicitly must agree with it.
absl::StatusOr<GPT2Config> ResolveModelConfig(const Config& config);

// Refuses a world that is not parallel.pp × parallel.dp ranks, saying what would fit.
absl::Status CheckWorldSize(const Config& config, int world_size);

// The overhead of side tasks from a run's alternating blocks: `steps` is (harvesting, step
// time) of each step in order; each block with side tasks that has a block without on either
// side is compared with their mean (a first or last block with side tasks is left out), and
// the ratios give a mean with its 95% interval (trainer/study_stats.h). None without a pair.
std::optional<Estimate> AlternatingOverhead(const std::vector<std::pair<bool, double>>& steps);
// That estimate as the run states it against `budget` (freeride.max_overhead), beside the
// noise of the run's own plain blocks (PlainBlockNoise). None without a pair.
std::optional<OverheadFigure> AlternatingOverheadFigure(
    const std::vector<std::pair<bool, double>>& steps, double budget);

class Trainer {
 public:
  // Builds this rank's model chunks, schedule, data loaders and optimizer, and resumes when
  // checkpoint.resume is set. `transport` connects the ranks (not owned; null: one process).
  // `clock` times the steps, bubbles and side tasks (not owned; null: the system clock). On a
  // simulated one the model's compute takes the time its FLOPs would at
  // kSimulatedFlopsPerSecond, and the costs that a run on real time measures (the balanced
  // split's, the emulated peers') come from that FLOP model: a run whose every figure is
  // exact, for tests.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const Config& config,
                                                         pipeline::Transport* transport = nullptr,
                                                         Clock* clock = nullptr);
  ~Trainer();

  // Runs the remaining steps with logging (rank 0), evaluation and checkpoints. A stop
  // request (SIGTERM, SIGINT, SIGUSR1) ends it after the current step with a checkpoint and
  // a Cancelled status that says how to resume. A run that fails still completes the
  // background checkpoint in flight first, on every rank.
  absl::Status Run();
  // The run's last metrics record (rank 0): {"kind": "end", "status": "finished" | "stopped" |
  // "failed", "reason"}, and the command that shows the run. A run without one is in progress
  // or was killed.
  void RecordEnd(const absl::Status& status);
  // One optimizer step over train.microbatches micro-batches per replica.
  absl::StatusOr<StepStats> Step();
  // ZeRO-1 (parallel.zero = 1): Step leaves the last update's all-gather of the parameters in
  // flight, for the next step's forwards to wait for, unless the run ends or stops after it.
  // This finishes it: every chunk's parameters whole (Evaluate and SaveCheckpoint call it).
  // Nothing in flight, or no ZeRO-1: returns at once.
  absl::Status CompleteParams() { return executor_->FinishZeroGather(); }
  // Mean loss over eval.batches validation batches (from the start of the validation data).
  absl::StatusOr<double> Evaluate();
  // Writes a checkpoint of this step (collective); `background`: from a snapshot, by a thread,
  // returning at once with the directory it will have (checkpoint_writer.h).
  absl::StatusOr<std::string> SaveCheckpoint(bool background = false);
  // run.dir/timeline_rankNNN.json and run.dir/timeline.svg of the recorded steps (collective).
  absl::Status WriteTimelines() {
    absl::Status s = WriteTimeline();
    return s.ok() ? WriteTimelineSvg() : s;
  }

  int64_t step() const { return step_; }
  // The process that writes the run's metrics, reports and checkpoint manifests: rank 0, or
  // the one process of an emulated-peers run (whatever stage it plays).
  bool leader() const { return config_.runtime.emulate_peers || transport_->rank() == 0; }
  // This rank's model chunks (one unless parallel.schedule is interleaved).
  StageModel& model(int chunk = 0) { return *chunks_[chunk]; }
  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  const pipeline::RankLayout& layout() const { return layout_; }
  // This rank's schedule and the measured timing of each of its instructions in the last step.
  const pipeline::Schedule& schedule() const { return executor_->schedule(); }
  // The training step's executor (tests reach its checks through it).
  pipeline::StageExecutor& executor() { return *executor_; }
  const std::vector<pipeline::InstrTiming>& last_timeline() const { return last_timeline_; }
  double last_step_start_s() const { return last_step_start_s_; }  // on the trainer's clock
  Clock& clock() { return ClockOr(clock_); }
  pipeline::Transport& transport() { return *transport_; }
  // With runtime.emulate_peers: the measured per-stage costs the emulator times peers with.
  const pipeline::CostModel& emulation_cost() const { return emulation_cost_; }
  // This rank's side-task executor (null without freeride.enabled or tasks for this stage).
  SideTaskExecutor* side_tasks() { return side_.get(); }
  // What every stage's rank of this replica holds at its peak and leaves to side work
  // (runtime.memory_fraction), stage 0 first; fill jobs and side tasks are placed by it.
  const std::vector<RankMemoryPlan>& memory_plans() const { return memory_plans_; }
  const std::string& checkpoint_dir() const { return checkpoint_dir_; }

 private:
  explicit Trainer(const Config& config);
  absl::Status Resume(const std::string& path);
  absl::StatusOr<std::vector<double>> GradientUnits();
  absl::Status OptimizerStep(const std::vector<double>& summed_units, bool loss_finite);
  // AdamW at last_lr_ as AdamW's 1-based `step`, gradients times `grad_scale` (clipping).
  absl::Status ApplyUpdate(int64_t step, double grad_scale);
  // This rank's part of what every rank agrees on after the step (waits, memory, the stop
  // flag, side tasks' bubbles, fill jobs, the step time), and what the step leaves once the
  // exchange is summed (train_step.cc).
  absl::StatusOr<StepExchange> StepSums(const pipeline::StepOutcome& outcome,
                                        std::map<int, double>* predicted_here);
  absl::Status FinishStep(const pipeline::StepOutcome& outcome, const StepExchange& summed,
                          bool harvesting, std::map<int, double> predicted_here, StepStats* stats);
  // Post-validated steps (optim.step_sync): the copy a rollback needs, whether this rank steps
  // before the global state (its own share of it clean), the speculative step, the validation
  // (true: confirmed; else rolled back and redone as the barrier would have), and whether the
  // next step may run ahead of it.
  absl::Status KeepBackup();
  bool WillSpeculate(const std::vector<double>& own, bool loss_finite) const;
  absl::Status Speculate();
  absl::StatusOr<bool> Validate(const pipeline::StepState& state);
  bool RunsAhead() const;
  // Every stage's memory plan (trainer/rank_memory.h) with this process's baseline, logged for
  // this rank's stage; refuses a run whose host buffers would not fit in the memory this
  // process may use. `mpi`: the data-parallel sums run on MPI; `device_transport`: the
  // transport carries device memory (NCCL).
  absl::Status PlanMemory(const PipelinePlan& plan, const pipeline::Schedule& schedule, bool mpi,
                          bool device_transport);
  // On resume: drops metrics rows of steps after the checkpoint (a killed run wrote them), and
  // takes the elapsed time the kept rows reached.
  absl::Status TrimMetricsAfterResume();
  // The leader's peak FLOP/s for MFU, logged and recorded as the run's "start" record.
  void StartMetrics();
  // Model FLOPs of one optimizer step over every replica (forward and backward).
  double FlopsPerStep() const;
  // Model FLOPs utilisation of a step that took `step_s`; NaN without a known peak, and NaN
  // (with a warning, once) above 100%: that says the peak is wrong, not the run.
  double Mfu(double step_s);
  absl::Status StopAfterSignal(int64_t total);
  absl::Status RunSteps();
  absl::Status WriteTrainMetric(const StepStats& s);
  absl::Status Barrier();
  // ZeRO-1, for a checkpoint: chunk `c`'s fp32 master whole in `params` (GetParams's), where
  // the chunk keeps its share's only (StageModel::MasterParamElements): each element from its
  // owner in the data-parallel group (collective over it).
  absl::Status GatherMaster(int c, float* params);
  pipeline::MicrobatchData Microbatches() const;
  void WriteMetric(const std::string& json);
  absl::Status WriteTimeline() const;
  // The Chrome-trace flow event of a SEND or RECV in recorded step `step` at `ts_us`; empty
  // for other instructions.
  std::string FlowEvent(int64_t step, const pipeline::Instr& in, double ts_us) const;
  absl::Status WriteTimelineSvg();
  // Fills bubble_slots_ from the executed schedule (with side tasks; else leaves it empty).
  void IndexBubbles();
  // Gives the side tasks' executor this stage's schedule: its BUBBLEs' identities, predicted
  // durations (when schedule_seconds_per_ms_ says its costs were in ms) and the memory free in
  // them (the rank's memory plan).
  void SeedBubblePredictions();
  // The virtual stage this rank's chunk `chunk` computes (by the schedule's placement).
  int VirtualStageOf(int chunk) const {
    return pipeline::VirtualStageOf(executor_->schedule().placement, layout_.pp, layout_.stage,
                                    chunk);
  }
  absl::Status PlaceBubblesFromMeasuredCosts(const std::vector<pipeline::InstrTiming>& timeline);
  absl::Status CreateSideTasks();
  // Fill jobs (freeride.jobs): every rank takes part, the leader reads the queue.
  absl::Status CreateJobRunner();
  absl::Status ReportHarvest();
  // The overhead budget (freeride.overhead_check, trainer/overhead_guard.h): whether the step
  // with 0-based index `step` harvests, and the guard's view of a step just run (its time
  // agreed by every rank), with the decision applied to the executor and recorded.
  bool HarvestingStep(int64_t step) const;
  void ObserveOverhead(int64_t step, double mean_step_s);
  void ApplySideLevel(SideLevel level);

  Config config_;
  GPT2Config model_config_;
  // Training FLOPs per token, recomputation included (MFU's numerator).
  double flops_per_token_ = 0;
  pipeline::RankLayout layout_;
  std::vector<RankMemoryPlan> memory_plans_;
  std::unique_ptr<pipeline::Transport> own_transport_;
  Clock* clock_ = nullptr;
  pipeline::Transport* transport_ = nullptr;
  std::vector<std::unique_ptr<StageModel>> chunks_;
  std::unique_ptr<pipeline::StageExecutor> executor_, eval_executor_;
  std::optional<TokenLoader> train_, val_;
  std::vector<int32_t> inputs_, targets_;
  int64_t step_ = 0;
  double last_grad_norm_ = 0, last_lr_ = 0;
  bool last_applied_ = true;   // whether the last OPTIMIZER applied its update
  // Post-validated steps: each chunk's parameters and AdamW moments before the speculative
  // step, whether it was taken, and whether the next step's batch is loaded already.
  struct Backup {
    std::vector<float> params, m, v;
  };
  std::vector<Backup> backup_;
  bool speculated_ = false;
  bool next_batch_loaded_ = false;
  bool resumed_ = false;
  int64_t first_step_ = 0;  // the step this part of the run began at (0, or the one resumed)
  int64_t nonfinite_in_row_ = 0;
  std::string checkpoint_dir_;
  std::ofstream metrics_;
  // run.tensorboard: metrics rows as TensorBoard scalars too (leader).
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  std::vector<std::pair<int64_t, std::vector<pipeline::InstrTiming>>> timelines_;
  std::vector<pipeline::InstrTiming> last_timeline_;
  double last_step_start_s_ = 0;
  pipeline::CostModel emulation_cost_;
  std::vector<double> timeline_starts_;  // absolute start of each recorded step
  std::vector<bool> timeline_harvested_;  // whether side tasks ran in that step
  std::vector<double> timeline_bubble_s_;  // this rank's waiting time in that step
  // (stage, instruction index) of every BUBBLE of the schedule, in order: where each stage's
  // bubble records go in the per-step sum (set with the schedule).
  std::vector<std::pair<int, int>> bubble_slots_;
  // What a BUBBLE's duration_ms is in seconds: 1e-3 where the schedule's costs were measured or
  // simulated in ms, 0 where they were uniform (no prediction).
  double schedule_seconds_per_ms_ = 0;
  // Per recorded step: this rank's BUBBLEs' predictions then (ms, by instruction index).
  std::vector<std::map<int, double>> timeline_predicted_;
  // |predicted - measured| of every predicted bubble, per stage × bubble kind (seconds).
  std::vector<std::vector<double>> prediction_errors_;
  // Side tasks (freeride.enabled): this rank's executor, and whether each step after the first
  // harvested, with its time (alternating blocks give the overhead).
  std::unique_ptr<SideTaskExecutor> side_;
  std::unique_ptr<JobRunner> jobs_;
  std::unique_ptr<OverheadGuard> guard_;  // overhead_check "on" or "strict", with side tasks
  int benched_task_ = -1;                 // the task the guard benched, if any
  std::vector<std::pair<bool, double>> timed_steps_;
  // Metrics rows (leader): the peak MFU is taken against, and training time so far (on the
  // trainer's clock; earlier runs' share from the rows a resume keeps).
  PeakFlops peak_;
  bool above_peak_said_ = false;  // a step ran faster than peak_: said once
  double run_start_s_ = 0, elapsed_before_s_ = 0;
  // checkpoint.background: the write in flight. Last, so that it is waited for first.
  CheckpointWriter checkpoint_writer_;
};

}  // namespace freeride
