// The schedule IR: per pipeline stage, the ordered list of instructions one rank executes in a
// training step. Idle time is itself an instruction, BUBBLE, carrying its kind and predicted
// duration. A schedule prints as text (one line per stage) and as CSV, and parses back from
// both (round trips are tests).
//
// Text tokens (PyTorch-pipelining style; "c<k>" suffix names the model chunk when chunks > 1):
//   F3  forward of micro-batch 3          B3  full backward (input and weight gradients)
//   I3  backward for the input gradient   W3  backward for the weight gradient
//   SEND_F3 / RECV_F3  activation out / in     SEND_B3 / RECV_B3  gradient out / in
//   LOAD3  inputs (first stage) or labels (last stage) of micro-batch 3
//   REDUCE_TIED  REDUCE_GRADS  OPTIMIZER   BUBBLE(warmup,4.2ms)
#pragma once

#include <compare>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace freeride::pipeline {

enum class Op {
  kLoad,
  kForward,
  kBackward,        // input and weight gradients together
  kBackwardInput,   // zero-bubble split: input gradient only
  kBackwardWeight,  // zero-bubble split: weight gradient only
  kSendAct,
  kRecvAct,
  kSendGrad,
  kRecvGrad,
  kReduceTied,
  kReduceGrads,
  kOptimizer,
  kBubble,
};

enum class BubbleKind { kNone, kWarmup, kFill, kSteady, kCooldown, kSync };
inline constexpr int kNumBubbleKinds = 6;

enum class ScheduleKind {
  kGPipe,
  k1F1B,
  kInterleaved,
  kZBH1,
  kZBH2,
  kZBV,
  kDualPipeV,
  kCustom,
};

// Where a stage's model chunks sit in the model. Loop (Megatron's interleaving): chunk c of
// stage s is virtual stage c·p + s. V (ZB-V, DualPipeV): even chunks run down the stages and
// odd chunks back up, chunk c of stage s is c·p + s for even c and c·p + p−1−s for odd c, so
// with two chunks stage 0 holds both the first and the last virtual stage.
enum class Placement { kLoop, kV };

// How one step's end meets the next. Barrier: OPTIMIZER waits for every stage (the global
// gradient norm and non-finite check) and the next step starts after it. Post-validate (the
// Zero Bubble paper's optimizer post-validation): each stage steps as soon as its own gradients
// are summed, speculatively, and goes on with the next step; the global state is checked at the
// next step's validation point (ValidationPoint), where a stage that stepped wrongly rolls back.
enum class StepSync { kBarrier, kPostValidate };

struct Instr {
  Op op = Op::kForward;
  int stage = 0;
  int chunk = 0;
  int microbatch = -1;  // -1 for step-level ops (REDUCE_*, OPTIMIZER, BUBBLE)
  int buffer = -1;      // activation slot of F/B/I/W (assigned by AssignBuffers)
  int peer = -1;        // SEND/RECV: the other stage (assigned by ResolvePeers)
  BubbleKind bubble = BubbleKind::kNone;
  double duration_ms = 0;  // BUBBLE: predicted duration
  int64_t free_bytes = -1;  // BUBBLE: device memory free for side tasks; -1 unknown

  bool operator==(const Instr&) const = default;
};

struct Schedule {
  ScheduleKind kind = ScheduleKind::kCustom;
  int stages = 1;        // p
  int microbatches = 1;  // m
  int chunks = 1;        // v: model chunks per stage
  Placement placement = Placement::kLoop;
  StepSync step_sync = StepSync::kBarrier;
  std::vector<std::vector<Instr>> per_stage;
  std::vector<int> buffers_per_stage;  // activation slots each stage needs
};

bool IsCompute(Op op);   // F, B, I, W
bool IsBackward(Op op);  // B, I
// The virtual (model-chunk) stage that chunk `chunk` of `stage` computes, by the placement.
inline int VirtualStageOf(Placement placement, int stages, int stage, int chunk) {
  const bool up = placement == Placement::kV && chunk % 2 == 1;
  return chunk * stages + (up ? stages - 1 - stage : stage);
}
inline int VirtualStage(const Schedule& s, const Instr& in) {
  return VirtualStageOf(s.placement, s.stages, in.stage, in.chunk);
}
// The stage that holds virtual stage `k` (its chunk is k / p).
inline int StageOfVirtual(Placement placement, int stages, int k) {
  const int c = k / stages, r = k % stages;
  return placement == Placement::kV && c % 2 == 1 ? stages - 1 - r : r;
}
inline int StageOfVirtual(const Schedule& s, int k) {
  return StageOfVirtual(s.placement, s.stages, k);
}

absl::string_view ScheduleKindName(ScheduleKind kind);
// The placement a kind's generator uses (V for zbv and dualpipev).
Placement PlacementOf(ScheduleKind kind);
absl::string_view PlacementName(Placement placement);  // "loop", "v"
absl::StatusOr<Placement> ParsePlacement(absl::string_view name);
absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name);
absl::string_view StepSyncName(StepSync sync);  // "barrier", "post_validate"
absl::StatusOr<StepSync> ParseStepSync(absl::string_view name);
// Where a post-validated stage checks the previous step's global state: before its first
// instruction that is not a forward's (LOAD, RECV_ACT, F, SEND_ACT) or a BUBBLE, so only the
// next step's first forwards run on speculatively updated weights. The list's size if none.
size_t ValidationPoint(const std::vector<Instr>& instrs);
// A BUBBLE's identity across placements (InsertBubbles with other costs moves BUBBLEs and so
// their indices, never the other instructions): the instruction it waits at, counted among the
// stage's non-BUBBLE instructions; its kind; its place among the BUBBLEs with both. What is
// measured of a bubble stays with it when the bubbles are placed again.
struct BubbleKey {
  int anchor = 0;
  BubbleKind kind = BubbleKind::kNone;
  int nth = 0;
  friend auto operator<=>(const BubbleKey&, const BubbleKey&) = default;
};
// The keys of `instrs`' BUBBLEs, indexed like `instrs` (other entries: anchor -1).
std::vector<BubbleKey> BubbleKeys(const std::vector<Instr>& instrs);
absl::string_view BubbleKindName(BubbleKind kind);
absl::StatusOr<BubbleKind> ParseBubbleKind(absl::string_view name);
absl::string_view OpName(Op op);  // "FORWARD", "SEND_ACT", ...

// One token ("F3", "SEND_B2c1", "BUBBLE(fill,2.5ms)"); the chunk suffix only when chunks > 1.
std::string FormatInstr(const Instr& instr, int chunks);
absl::StatusOr<Instr> ParseInstr(absl::string_view token, int stage);

// Text form: a header comment naming kind, p, m, v, placement and step sync, then
// "stageN: tok tok ..." per stage.
std::string ScheduleToText(const Schedule& schedule);
// Reads the text form. Without the header, p is the number of stage lines and m, v are
// inferred from the tokens and the placement is loop. Peers and buffers are derived (see passes.h).
absl::StatusOr<Schedule> ScheduleFromText(absl::string_view text);

// CSV: header "stage,index,op,chunk,microbatch,buffer,peer,bubble,duration_ms,free_bytes".
std::string ScheduleToCsv(const Schedule& schedule);
absl::StatusOr<Schedule> ScheduleFromCsv(absl::string_view text);

}  // namespace freeride::pipeline
