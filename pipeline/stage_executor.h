// Runs one rank's instruction list for a training step: the model chunks this rank holds,
// activations and gradients to and from its neighbours (receives posted when the step starts,
// sends that never block the compute after them), the tied-embedding and data-parallel sums,
// and BUBBLE handed to a hook. Every instruction's start and end are recorded. A
// post-validated schedule's steps overlap (see RunAhead).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/clock.h"
#include "core/nvtx.h"
#include "models/stage_model.h"
#include "pipeline/comm/transport.h"
#include "pipeline/cost_model.h"
#include "pipeline/grad_buckets.h"
#include "pipeline/schedule.h"

namespace freeride::pipeline {

// Where a rank sits in the PP × DP grid. Ranks of one replica are adjacent:
// rank = replica · pp + stage.
struct RankLayout {
  int pp = 1, dp = 1, chunks = 1;
  int stage = 0, replica = 0;
  int RankOf(int stage_index, int replica_index) const { return replica_index * pp + stage_index; }
  int rank() const { return RankOf(stage, replica); }
  std::vector<int> PipelineGroup() const;      // this replica's stages
  std::vector<int> DataParallelGroup() const;  // this stage in every replica
};

// The side-task executor plugs in here. OnBubble is called at each BUBBLE instruction
// (`index`: its place in the stage's list, the bubble's identity from step to step;
// `start_s` on the executor's clock) and returns when the hook hands the rank back;
// `input_ready` polls the input the bubble waits for; it is empty where that cannot be polled
// (the sums), and the hook must then keep to its own prediction of the bubble's end.
// OnBubbleEnd says when the instruction the bubble waited at stopped its first wait.
class BubbleHook {
 public:
  virtual ~BubbleHook() = default;
  virtual void OnBubble(const Instr& bubble, int index, double start_s,
                        const std::function<bool()>& input_ready) = 0;
  virtual void OnBubbleEnd(int index, double end_s) = 0;
};

struct InstrTiming {
  int index = 0;                  // into the stage's instruction list
  double start_s = 0, end_s = 0;  // since the step started
  double wait_end_s = 0;          // a waiting instruction: start + its time spent waiting (else 0)
};

struct StepOutcome {
  double loss = 0;  // mean over the step's micro-batches and replicas, on every rank
  double step_s = 0;
  double bubble_s = 0;  // time this rank waited for peers (receives and sums)
  double start_s = 0;   // on the executor's clock, when the step began (timeline origin)
  std::vector<InstrTiming> timeline;
};

// A micro-batch's tokens and targets, `rows` = micro-batch size × sequence length each.
struct MicrobatchData {
  std::function<const int32_t*(int microbatch)> tokens;
  std::function<const int32_t*(int microbatch)> targets;
  int64_t rows = 0;
};

// The optimizer step, in the two halves around the pipeline-wide sum OPTIMIZER waits in:
// `units` gives this rank's gradient squares at their places in the whole model (zeros
// elsewhere); the executor sums them over the pipeline; `apply` gets the sums, and whether
// every head in the job saw a finite loss this step (carried inside the same sum, so that all
// ranks decide alike whether to apply the update).
struct OptimizerHooks {
  std::function<absl::StatusOr<std::vector<double>>()> units;
  std::function<absl::Status(const std::vector<double>& summed, bool loss_finite)> apply;
  // Post-validated steps instead of `apply`: keeping what a rollback needs (the weights and
  // optimizer state as the last step left them: the executor calls it once a step, in the
  // first BUBBLE after the validation point predicted to hold it, else before `speculate`);
  // whether this rank steps before the global state is known, judged from its own units
  // (zeros elsewhere) and its head's loss; then that step. The global state comes later
  // (AwaitState).
  std::function<absl::Status()> prepare;
  std::function<bool(const std::vector<double>& own, bool loss_finite)> will_speculate;
  std::function<absl::Status()> speculate;
};

// A post-validated step's global state, summed over every rank of the job.
struct StepState {
  std::vector<double> units;   // the gradient norm's units, in model order
  bool loss_finite = true;     // every replica's head saw a finite loss
  bool all_speculated = true;  // every rank stepped before this was known
  double loss = 0;             // mean over the step's micro-batches and replicas
};

class StageExecutor {
 public:
  // `chunks[c]` is this rank's model chunk c (its virtual stage by the schedule's placement,
  // VirtualStageOf); each has at least
  // schedule.buffers_per_stage[stage] slots. `optimizer` runs at OPTIMIZER (none: skipped).
  StageExecutor(Schedule schedule, RankLayout layout, std::vector<StageModel*> chunks,
                Transport* transport, double timeout_s, OptimizerHooks optimizer);

  void set_bubble_hook(BubbleHook* hook) { hook_ = hook; }
  // What the step is timed on (not owned; null: the system clock). On a simulated clock the
  // model's compute takes no time unless `compute` is given: each compute instruction then
  // takes its time by that cost model, as the simulator times it.
  void set_clock(Clock* clock, std::optional<CostModel> compute = std::nullopt) {
    clock_ = clock;
    compute_ = std::move(compute);
  }
  // Whether each compute instruction ends once the device has finished it (StageModel::Drain,
  // a wait each): the timeline then times the device's work. Off, a compute instruction ends
  // once its work is queued, and the device is waited for where the host needs it: before a
  // BUBBLE (side work finds it idle), at messages and sums, and for the step's losses at
  // OPTIMIZER. The CPU's compute is synchronous: the same either way. Between steps only.
  void set_exact_timeline(bool exact) { exact_timeline_ = exact; }
  // Swaps in the same schedule with its BUBBLE instructions placed anew (same compute and
  // communication order; e.g. from measured costs). Between steps only.
  void set_schedule(Schedule schedule) { schedule_ = std::move(schedule); }
  const Schedule& schedule() const { return schedule_; }
  // The data-parallel sum in buckets of about `mib` MiB, each started as the step's last
  // backward finishes its gradients (grad_buckets.h); 0: one sum per chunk at REDUCE_GRADS.
  // `zero` (ZeRO-1, parallel.zero = 1): each bucket's sum a reduce-scatter, this rank keeping
  // its share's summed gradients only (GradBuckets::owned), in buckets even at 0
  // (kZeroBucketMb then). Between steps only; no effect without a data-parallel group or a
  // backward.
  void set_dp_bucket_mb(double mib, bool zero = false);
  // ZeRO-1: whether it is on. After this rank has stepped its share, StartZeroGather starts
  // the all-gathers that make every rank's parameters whole again (GradBuckets::StartGather),
  // and each chunk's is waited for where the next step first reads its parameters, the chunk's
  // first FORWARD (counted as waiting, in bubble_s): the gather overlaps what comes before it
  // there (the next batch's loading, the earlier stages' forwards, the earlier chunks'). What
  // reads or writes the parameters outside a step (evaluation, checkpoints, a rollback, the
  // run's end) calls FinishZeroGather first. With `overlap` off, StartZeroGather finishes
  // them itself (the step then ends with whole parameters).
  bool zero() const { return buckets_ && buckets_->zero(); }
  void set_zero_overlap(bool overlap) { zero_overlap_ = overlap; }
  absl::Status StartZeroGather();
  absl::Status FinishZeroGather();
  // Tests: the buckets check their gradients did not change after their sums began.
  void set_verify_buckets(bool verify) {
    if (buckets_) buckets_->set_verify(verify);
  }
  const GradBuckets* buckets() const { return buckets_.get(); }
  const std::vector<Instr>& instructions() const { return schedule_.per_stage[layout_.stage]; }

  // The message buffers chunk `chunk` of a rank running `instructions` gives the executor (one
  // per message it receives or sends a step, each kind and micro-batch its own): in device
  // memory where the transport carries it, which the chunk's memory check counts.
  static int64_t MessageBuffersOf(const std::vector<Instr>& instructions, int chunk);

  // The message tag of an activation (gradient = false) or gradient sent by virtual stage
  // `sender` for `microbatch`, in a pipeline of `virtual_stages` and `microbatches`.
  static int MessageTag(bool gradient, int sender, int microbatch, int virtual_stages,
                        int microbatches) {
    return ((gradient ? virtual_stages : 0) + sender) * microbatches + microbatch;
  }

  // One training step. `loss_scale` multiplies the per-token loss gradient (1 / tokens in the
  // global batch). Errors name the instruction a rank was blocked on. Post-validated, it goes
  // on from where RunAhead left the step, and its outcome has no loss: the step's OPTIMIZER
  // starts the sum of its global state (loss included) and speculates, and the step ends.
  absl::StatusOr<StepOutcome> RunStep(const MicrobatchData& data, float loss_scale);

  // Post-validated steps overlap: after RunStep, the next step's instructions before its
  // validation point (ValidationPoint: its first forwards) may run on the speculatively
  // updated weights while the global state is summed. Every rank runs ahead or none does.
  absl::Status RunAhead(const MicrobatchData& data, float loss_scale);
  // Waits for the global state of the last step RunStep ran.
  absl::StatusOr<StepState> AwaitState();
  // When the state rolls the step back (or the run stops), what RunAhead did is undone:
  // the messages its forwards sent are drained where they landed and their receives posted
  // again, so that the next RunStep runs the step from its start. Every rank that ran ahead.
  absl::Status DiscardAhead();
  bool ran_ahead() const { return step_.begun; }

 private:
  // The step in progress, begun by RunStep or RunAhead.
  struct Progress {
    bool begun = false;
    size_t next = 0;  // the next instruction
    double t0 = 0, head_loss = 0;
    int open_bubble = -1;  // the BUBBLE whose awaited instruction comes next
    StepOutcome outcome;
  };
  // `ahead` (RunAhead): of the step's receives, only those before the validation point and
  // those whose messages the peers send ahead of theirs are posted; the rest once the
  // validation has kept the step (RunStep) or rolled it back (DiscardAhead).
  absl::Status BeginStep(bool ahead = false);
  absl::Status PostReceives(bool ahead);
  absl::Status PostReceive(const Instr& in);
  // Whether the peer sends the message `in` receives before its validation point.
  bool SentAhead(const Instr& in) const;
  // Runs the step's instructions up to `end`.
  absl::Status RunUntil(size_t end, const MicrobatchData& data, float loss_scale);
  bool PostValidated() const { return schedule_.step_sync == StepSync::kPostValidate; }
  absl::Status Execute(const Instr& in, const MicrobatchData& data, float loss_scale,
                       double* head_loss, double* waited);
  // Adds the losses the head's chunk kept since they were last taken: once a step (at
  // OPTIMIZER, else at the step's end), not once a micro-batch.
  absl::Status TakeHeadLoss(double* head_loss);
  // Post-validated: REDUCE_TIED starts the tied sum; what needs it next waits for it.
  absl::Status StartTiedSum();
  absl::Status FinishTiedSum(double* waited);
  absl::Status Prepare();  // OptimizerHooks::prepare, timed
  // Post-validated OPTIMIZER: the units and the flags into the global state's sum, then the
  // speculative step.
  absl::Status StartGlobalState(double head_loss, double* waited);
  absl::Status Arrive(const std::vector<int>& group, double* waited);
  // Adds a wait to the instruction's total; the first of an instruction is kept apart.
  void CountWait(double seconds, double* waited) {
    *waited += seconds;
    if (first_wait_s_ < 0) first_wait_s_ = seconds;
    EndNvtxBubble();
  }
  // The open bubble's NVTX range ends where the bubble does: the awaited instruction's first
  // wait, or its end when it never waited.
  void EndNvtxBubble() {
    if (!nvtx_bubble_open_) return;
    FR_NVTX_RANGE_END(nvtx_bubble_);
    nvtx_bubble_open_ = false;
  }
  absl::Status ReduceTied(double* waited);
  absl::Status ReduceDataParallel(double* waited);
  // Polls the receive the BUBBLE at `bubble_index` waits for (always false if none).
  std::function<bool()> InputReady(size_t bubble_index) const;
  int VirtualStage(int chunk) const {
    return VirtualStageOf(schedule_.placement, layout_.pp, layout_.stage, chunk);
  }
  int NumVirtualStages() const { return layout_.pp * layout_.chunks; }
  int Tag(bool gradient, int sender_virtual_stage, int microbatch) const;
  // Every message's buffer, allocated once by the chunk that fills or reads it (BeginStep).
  absl::Status AllocateMessages();
  int64_t MessageBytes() const { return chunks_[0]->MessageBytes(); }
  // Before receives are posted into buffers a chunk may still be reading (StageModel).
  absl::Status FinishMessageReads();
  std::string Describe(const Instr& in) const;
  Clock& clock() const { return ClockOr(clock_); }

  Schedule schedule_;
  RankLayout layout_;
  std::vector<StageModel*> chunks_;
  Transport* transport_;
  double timeout_s_;
  double first_wait_s_ = -1;  // the current instruction's first wait; < 0 before it waits
  // The NVTX range of the bubble in progress (CUDA builds only; core/nvtx.h).
  [[maybe_unused]] uint64_t nvtx_bubble_ = 0;
  bool nvtx_bubble_open_ = false;
  OptimizerHooks optimizer_;
  BubbleHook* hook_ = nullptr;
  Clock* clock_ = nullptr;
  std::optional<CostModel> compute_;
  std::vector<int> slot_of_;  // [chunk · m + microbatch] → activation slot
  // Message buffers, [chunk · m + microbatch], of the cells the instructions use (else null):
  // the chunk's MessageType, in its AllocateMessageBuffer's memory (on CUDA pinned, or device
  // memory when the transport carries it).
  std::vector<MessageBuffer> recv_act_, recv_grad_, send_act_, send_grad_;
  bool messages_allocated_ = false;
  std::vector<Transport::Request> recv_act_req_, recv_grad_req_;
  std::vector<Transport::Request> sends_;
  bool tied_reduced_ = false;
  bool has_backward_ = false;  // a forward-only (validation) schedule leaves gradients alone
  Progress step_;
  std::unique_ptr<GradBuckets> buckets_;          // parallel.dp_bucket_mb > 0
  bool zero_overlap_ = true;                      // parallel.zero_overlap
  std::vector<int> weight_instrs_, weight_left_;  // per chunk: its Bs and Ws, those still to run
  bool receives_posted_ = false;  // every receive of the step (after RunAhead: once it is over)
  std::vector<bool> posted_;      // per instruction: its receive is posted this step
  bool running_ahead_ = false;
  bool exact_timeline_ = true;
  // Post-validated: the tied sum in flight (its owner's wte gradient), the global state's.
  Transport::Request tied_request_ = -1;
  StageModel* tied_owner_ = nullptr;
  int64_t tied_offset_ = 0, tied_n_ = 0;
  Transport::Request state_request_ = -1;
  std::vector<double> state_;
  bool groups_ready_ = false;  // post-validated: every group's sum has run once (BeginStep)
  bool prepared_ = false;      // this step's OptimizerHooks::prepare has run
  double prepare_s_ = -1;      // how long it took last (unknown: < 0)
};

}  // namespace freeride::pipeline
