// The stage executor's post-validated steps (Schedule::step_sync = post_validate): the tied
// sum started as soon as its shares are made, the global state (the gradient norm's units,
// the non-finite and speculation counts, the loss) summed without a barrier while each rank
// steps speculatively, the next step's first forwards run ahead of the validation, and what
// they did undone when the validation rolls the step back.
#include <cmath>

#include "absl/strings/str_format.h"
#include "core/status.h"
#include "pipeline/device_grad_sum.h"
#include "pipeline/stage_executor.h"

namespace freeride::pipeline {

absl::Status StageExecutor::StartTiedSum() {
  // The embedding is virtual stage 0 on stage 0; the head the last virtual stage, on a stage
  // of its own here (REDUCE_TIED exists only then). The head's share was made in its Is.
  const int head_stage = StageOfVirtual(schedule_, NumVirtualStages() - 1);
  StageModel* head = chunks_[layout_.chunks - 1];
  if (layout_.stage == head_stage) {
    if (absl::Status s = head->FoldHeadWteGrad(); !s.ok()) return s;
  }
  tied_owner_ = layout_.stage == 0 ? chunks_[0] : head;
  tied_offset_ = tied_owner_->layout().slot(ParamTensor::kWte).offset;
  tied_n_ = TiedElements(chunks_[0]->config());
  if (tied_n_ == 0) return absl::OkStatus();  // an untied head: ReduceTied has nothing to do
  const std::vector<int> pair = {layout_.RankOf(0, layout_.replica),
                                 layout_.RankOf(head_stage, layout_.replica)};
  absl::StatusOr<Transport::Request> r;
  if (SumsOnDevice(*transport_, *tied_owner_)) {
    r = StartDeviceGradSum(*tied_owner_, {{tied_offset_, tied_n_}}, *transport_, pair);
  } else {
    absl::StatusOr<float*> grads = tied_owner_->HostGrads(tied_offset_, tied_n_);
    if (!grads.ok()) return grads.status();
    r = transport_->StartAllReduceSum(*grads, tied_n_, pair);
  }
  if (!r.ok()) return r.status();
  tied_request_ = *r;
  return absl::OkStatus();
}

absl::Status StageExecutor::FinishTiedSum(double* waited) {
  const double start = clock().Now();
  absl::Status s = transport_->Wait(tied_request_, timeout_s_);
  CountWait(clock().Now() - start, waited);
  tied_request_ = -1;
  if (!s.ok() || SumsOnDevice(*transport_, *tied_owner_)) return s;  // on the device: in place
  return tied_owner_->CommitHostGrads(tied_offset_, tied_n_);
}

absl::Status StageExecutor::StartGlobalState(double head_loss, double* waited) {
  absl::Status s = tied_reduced_        ? absl::OkStatus()
                   : tied_request_ >= 0 ? FinishTiedSum(waited)
                                        : ReduceTied(waited);
  tied_reduced_ = true;
  if (!s.ok() || !optimizer_.units) return s;
  absl::StatusOr<std::vector<double>> units = optimizer_.units();
  if (!units.ok()) return units.status();
  // Only a head sees a loss (the others' is 0, finite).
  const bool finite = std::isfinite(head_loss);
  bool speculate = optimizer_.will_speculate(*units, finite);
  if (zero()) {
    // ZeRO-1: a speculative step ends in an all-gather over the data-parallel group, so its
    // members step ahead together or not at all (their heads' losses differ).
    double behind[1] = {speculate ? 0.0 : 1.0};
    FR_RETURN_IF_ERROR(
        transport_->AllReduceSum(behind, 1, layout_.DataParallelGroup(), timeout_s_));
    speculate = behind[0] == 0.0;
  }
  // Units (replica 0's: the replicas' are the same, and one non-zero term per unit sums
  // exactly in any order), how many heads saw a non-finite loss, how many ranks did not step
  // ahead, then each replica's loss in its own place, added in replica order when it arrives.
  const size_t u = units->size();
  state_.assign(u + 2 + layout_.dp, 0.0);
  if (layout_.replica == 0) std::copy(units->begin(), units->end(), state_.begin());
  state_[u] = finite ? 0.0 : 1.0;
  state_[u + 1] = speculate ? 0.0 : 1.0;
  if (layout_.stage == StageOfVirtual(schedule_, NumVirtualStages() - 1)) {
    state_[u + 2 + layout_.replica] = head_loss / schedule_.microbatches;
  }
  absl::StatusOr<Transport::Request> r = transport_->StartAllReduceSum(
      state_.data(), static_cast<int64_t>(state_.size()), transport_->AllRanks());
  if (!r.ok()) return r.status();
  state_request_ = *r;
  if (!speculate) return absl::OkStatus();
  if (!prepared_) FR_RETURN_IF_ERROR(Prepare());
  return optimizer_.speculate();
}

absl::Status StageExecutor::Prepare() {
  const double start = clock().Now();
  absl::Status s = optimizer_.prepare ? optimizer_.prepare() : absl::OkStatus();
  prepare_s_ = clock().Now() - start;
  prepared_ = true;
  return s;
}

absl::Status StageExecutor::RunAhead(const MicrobatchData& data, float loss_scale) {
  if (!PostValidated() || step_.begun) {
    return absl::FailedPreconditionError("runs ahead only between post-validated steps");
  }
  if (absl::Status s = BeginStep(/*ahead=*/true); !s.ok()) return s;
  running_ahead_ = true;
  absl::Status s = RunUntil(ValidationPoint(instructions()), data, loss_scale);
  running_ahead_ = false;
  return s;
}

absl::StatusOr<StepState> StageExecutor::AwaitState() {
  if (state_request_ < 0) {
    return absl::FailedPreconditionError("no post-validated step's state to wait for");
  }
  const double start = clock().Now();
  absl::Status s = transport_->Wait(state_request_, timeout_s_);
  // Where the stage ran ahead, this wait belongs to the next step's bubbles.
  if (step_.begun) step_.outcome.bubble_s += clock().Now() - start;
  state_request_ = -1;
  if (!s.ok()) {
    return absl::Status(
        s.code(), absl::StrFormat("rank %d (stage %d, replica %d) waiting for "
                                  "the last step's global state: %s",
                                  layout_.rank(), layout_.stage, layout_.replica, s.message()));
  }
  StepState state;
  const size_t u = state_.size() - 2 - layout_.dp;
  state.units.assign(state_.begin(), state_.begin() + static_cast<long>(u));
  state.loss_finite = state_[u] == 0.0;
  state.all_speculated = state_[u + 1] == 0.0;
  double loss = 0;
  for (int r = 0; r < layout_.dp; ++r) loss = r == 0 ? state_[u + 2] : loss + state_[u + 2 + r];
  state.loss = loss / layout_.dp;
  return state;
}

bool StageExecutor::SentAhead(const Instr& in) const {
  const bool grad = in.op == Op::kRecvGrad;
  const int sender = VirtualStage(in.chunk) + (grad ? 1 : -1);
  const std::vector<Instr>& theirs = schedule_.per_stage[in.peer];
  for (size_t j = 0; j < ValidationPoint(theirs); ++j) {
    const Instr& t = theirs[j];
    if (t.op == (grad ? Op::kSendGrad : Op::kSendAct) && t.microbatch == in.microbatch &&
        VirtualStageOf(schedule_.placement, layout_.pp, in.peer, t.chunk) == sender) {
      return true;
    }
  }
  return false;
}

absl::Status StageExecutor::DiscardAhead() {
  if (!step_.begun) return absl::OkStatus();
  double dropped = 0;  // the losses of the forwards run ahead: the rerun makes them again
  FR_RETURN_IF_ERROR(TakeHeadLoss(&dropped));
  EndNvtxBubble();
  if (step_.open_bubble >= 0) hook_->OnBubbleEnd(step_.open_bubble, clock().Now());
  // Every rank ran exactly its instructions before its validation point: a message was sent
  // ahead where its SEND is there on the peer. Those were made with the rolled-back weights:
  // each is drained (if this stage has not taken it yet) and its receive posted again, and
  // then the receives the run ahead left for after it (BeginStep). Over NCCL a link's
  // receives match its messages in the order they were posted, not by tag: a receive posted
  // again behind one still waiting for a later micro-batch would take the wrong message and
  // leave the rerun waiting for one the peer sends only after it (both stages blocked on
  // micro-batch 0), so nothing but the messages sent ahead is posted before the validation.
  FR_RETURN_IF_ERROR(FinishMessageReads());
  const std::vector<Instr>& instrs = instructions();
  for (size_t i = 0; i < instrs.size(); ++i) {
    const Instr& in = instrs[i];
    if (in.op != Op::kRecvAct && in.op != Op::kRecvGrad) continue;
    if (!SentAhead(in)) continue;
    const int cell = in.chunk * schedule_.microbatches + in.microbatch;
    const Transport::Request request =
        (in.op == Op::kRecvGrad ? recv_grad_req_ : recv_act_req_)[cell];
    if (i >= step_.next) {
      if (absl::Status s = transport_->Wait(request, timeout_s_); !s.ok()) return s;
    }
    FR_RETURN_IF_ERROR(PostReceive(in));
  }
  FR_RETURN_IF_ERROR(PostReceives(/*ahead=*/false));
  // The rerun reuses the send buffers.
  for (Transport::Request r : sends_) {
    if (absl::Status s = transport_->Wait(r, timeout_s_); !s.ok()) return s;
  }
  sends_.clear();
  step_ = Progress{};
  return absl::OkStatus();
}

}  // namespace freeride::pipeline
