#include "pipeline/stage_executor.h"

#include <cmath>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"
#include "pipeline/device_grad_sum.h"
#include "pipeline/simulator.h"

namespace freeride::pipeline {

std::vector<int> RankLayout::PipelineGroup() const {
  std::vector<int> group;
  for (int s = 0; s < pp; ++s) group.push_back(RankOf(s, replica));
  return group;
}

std::vector<int> RankLayout::DataParallelGroup() const {
  std::vector<int> group;
  for (int r = 0; r < dp; ++r) group.push_back(RankOf(stage, r));
  return group;
}

StageExecutor::StageExecutor(Schedule schedule, RankLayout layout, std::vector<StageModel*> chunks,
                             Transport* transport, double timeout_s, OptimizerHooks optimizer)
    : schedule_(std::move(schedule)),
      layout_(layout),
      chunks_(std::move(chunks)),
      transport_(transport),
      timeout_s_(timeout_s),
      optimizer_(std::move(optimizer)) {
  const int m = schedule_.microbatches, cells = layout_.chunks * m;
  slot_of_.assign(cells, 0);
  bool tied_here = false;
  weight_instrs_.assign(layout_.chunks, 0);
  for (const Instr& in : instructions()) {
    if (in.op == Op::kForward) slot_of_[in.chunk * m + in.microbatch] = in.buffer;
    if (IsBackward(in.op)) has_backward_ = true;
    if (in.op == Op::kBackward || in.op == Op::kBackwardWeight) ++weight_instrs_[in.chunk];
    tied_here = tied_here || in.op == Op::kReduceTied;
  }
  // A post-validated head posts the tied sum after its last I (see InsertCommunication). Only
  // an executor that trains says so: a forward-only one (evaluation) on the same chunks must
  // not undo what the training executor set.
  for (StageModel* chunk : chunks_) {
    if (chunk->stage().has_head && has_backward_) {
      chunk->SetHeadGradInBackwardInput(PostValidated() && tied_here);
    }
  }
  recv_act_req_.assign(cells, -1);
  recv_grad_req_.assign(cells, -1);
}

absl::Status StageExecutor::AllocateMessages() {
  for (StageModel* chunk : chunks_) {
    if (chunk->message_type() != chunks_[0]->message_type() ||
        chunk->MessageBytes() != MessageBytes()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "rank %d holds chunks whose messages differ (%s, %d bytes; %s, %d bytes): every "
          "stage of a pipeline must have the same precision and shapes",
          layout_.rank(), MessageTypeName(chunks_[0]->message_type()), MessageBytes(),
          MessageTypeName(chunk->message_type()), chunk->MessageBytes()));
    }
  }
  // On a transport that carries device memory (NCCL) the messages stay on the chunks' device.
  const MessageMemory memory =
      transport_->CarriesDeviceMemory() ? MessageMemory::kDevice : MessageMemory::kHost;
  const int m = schedule_.microbatches, cells = layout_.chunks * m;
  for (auto* v : {&recv_act_, &recv_grad_, &send_act_, &send_grad_}) {
    v->clear();
    for (int c = 0; c < cells; ++c) v->emplace_back(nullptr, std::free);
  }
  for (const Instr& in : instructions()) {
    std::vector<MessageBuffer>* v = in.op == Op::kRecvAct    ? &recv_act_
                                    : in.op == Op::kRecvGrad ? &recv_grad_
                                    : in.op == Op::kSendAct  ? &send_act_
                                    : in.op == Op::kSendGrad ? &send_grad_
                                                             : nullptr;
    if (v == nullptr) continue;
    MessageBuffer& buffer = (*v)[in.chunk * m + in.microbatch];
    if (buffer != nullptr) continue;
    FR_ASSIGN_OR_RETURN(buffer, chunks_[in.chunk]->AllocateMessageBuffer(memory));
  }
  messages_allocated_ = true;
  return absl::OkStatus();
}

int64_t StageExecutor::MessageBuffersOf(const std::vector<Instr>& instructions, int chunk) {
  std::set<std::pair<Op, int>> cells;  // AllocateMessages's: one buffer per kind and micro-batch
  for (const Instr& in : instructions) {
    if (in.chunk == chunk && (in.op == Op::kRecvAct || in.op == Op::kRecvGrad ||
                              in.op == Op::kSendAct || in.op == Op::kSendGrad)) {
      cells.insert({in.op, in.microbatch});
    }
  }
  return static_cast<int64_t>(cells.size());
}

absl::Status StageExecutor::FinishMessageReads() {
  for (StageModel* chunk : chunks_) FR_RETURN_IF_ERROR(chunk->FinishMessageReads());
  return absl::OkStatus();
}

int StageExecutor::Tag(bool gradient, int sender_virtual_stage, int microbatch) const {
  return MessageTag(gradient, sender_virtual_stage, microbatch, NumVirtualStages(),
                    schedule_.microbatches);
}

std::string StageExecutor::Describe(const Instr& in) const {
  std::string what(OpName(in.op));
  if (in.microbatch >= 0) what += absl::StrFormat(" micro-batch %d", in.microbatch);
  if (layout_.chunks > 1) what += absl::StrFormat(" chunk %d", in.chunk);
  if (in.peer >= 0) {
    what += absl::StrFormat(" (peer: stage %d, rank %d)", in.peer,
                            layout_.RankOf(in.peer, layout_.replica));
  }
  return what;
}

// A sum of a large buffer is part waiting for the other members, part moving data. A one-value
// sum first marks the moment every member has arrived: only that counts as waiting (and ends a
// bubble); the transfer after it is the step's own work.
absl::Status StageExecutor::Arrive(const std::vector<int>& group, double* waited) {
  if (group.size() <= 1) return absl::OkStatus();
  double token[1] = {0};
  const double start = clock().Now();
  absl::Status s = transport_->AllReduceSum(token, 1, group, timeout_s_);
  CountWait(clock().Now() - start, waited);
  return s;
}

absl::Status StageExecutor::ReduceTied(double* waited) {
  // The embedding is virtual stage 0 (chunk 0 of stage 0); the head the last virtual stage,
  // chunk v-1 of the stage the placement puts it on (stage 0 too in a V).
  const int head_stage = StageOfVirtual(schedule_, NumVirtualStages() - 1);
  StageModel* head = chunks_[layout_.chunks - 1];
  if (layout_.stage == head_stage) {
    if (absl::Status s = head->FoldHeadWteGrad(); !s.ok()) return s;
  }
  const int64_t n = TiedElements(chunks_[0]->config());
  if (n == 0) return absl::OkStatus();  // an untied head: nothing to sum
  if (head_stage == 0) {
    // Embedding and head on this rank: in one chunk FoldHeadWteGrad already added them; in
    // separate chunks add here (emb + head, the same sum a two-rank all-reduce makes) and
    // give the head's copy the same gradient.
    if (layout_.stage == 0 && layout_.chunks > 1) {
      // Over NCCL on the device, as the two-rank tied sum is.
      if (SumsOnDevice(*transport_, *chunks_[0])) {
        FR_ASSIGN_OR_RETURN(const bool summed, chunks_[0]->SumTiedOnDevice(*head));
        if (summed) return absl::OkStatus();
      }
      const int64_t offset = chunks_[0]->layout().slot(ParamTensor::kWte).offset;
      const int64_t head_offset = head->layout().slot(ParamTensor::kWte).offset;
      absl::StatusOr<float*> emb = chunks_[0]->HostGrads(offset, n);
      if (!emb.ok()) return emb.status();
      absl::StatusOr<float*> tied = head->HostGrads(head_offset, n);
      if (!tied.ok()) return tied.status();
      for (int64_t i = 0; i < n; ++i) (*emb)[i] += (*tied)[i];
      std::memcpy(*tied, *emb, n * sizeof(float));
      if (absl::Status s = chunks_[0]->CommitHostGrads(offset, n); !s.ok()) return s;
      return head->CommitHostGrads(head_offset, n);
    }
    return absl::OkStatus();
  }
  if (layout_.stage != 0 && layout_.stage != head_stage) return absl::OkStatus();
  StageModel* owner = layout_.stage == 0 ? chunks_[0] : head;
  const std::vector<int> pair = {layout_.RankOf(0, layout_.replica),
                                 layout_.RankOf(head_stage, layout_.replica)};
  if (absl::Status s = Arrive(pair, waited); !s.ok()) return s;
  return SumGrads(*owner, owner->layout().slot(ParamTensor::kWte).offset, n, *transport_, pair,
                  timeout_s_);
}

void StageExecutor::set_dp_bucket_mb(double mib, bool zero) {
  buckets_.reset();
  if ((mib <= 0 && !zero) || layout_.dp <= 1 || !has_backward_) return;
  // ZeRO-1 without a bucket size: 4 MiB ones (kZeroBucketMb). One per chunk would have MPI's
  // reduce-scatter hold a temporary as large as the chunk's gradients: measured, the peak
  // then kept what the sharded moments saved.
  buckets_ = std::make_unique<GradBuckets>(chunks_, BucketFloats(mib, zero), transport_,
                                           layout_.DataParallelGroup(), zero);
}

absl::Status StageExecutor::StartZeroGather() {
  if (!zero()) return absl::FailedPreconditionError("no ZeRO-1 shares to gather");
  FR_RETURN_IF_ERROR(buckets_->StartGather());
  return zero_overlap_ ? absl::OkStatus() : buckets_->FinishGather(timeout_s_);
}

absl::Status StageExecutor::FinishZeroGather() {
  return zero() ? buckets_->FinishGather(timeout_s_) : absl::OkStatus();
}

absl::Status StageExecutor::ReduceDataParallel(double* waited) {
  if (buckets_) {
    // Most buckets are on their way since the last backward; wte's start now, after the tied
    // sum. What is left to wait for is the exposed part of the sum.
    FR_RETURN_IF_ERROR(buckets_->StartRemaining());
    FR_RETURN_IF_ERROR(Arrive(layout_.DataParallelGroup(), waited));
    const double start = clock().Now();
    absl::Status s = buckets_->Finish(timeout_s_);
    CountWait(clock().Now() - start, waited);
    return s;
  }
  if (absl::Status s = Arrive(layout_.DataParallelGroup(), waited); !s.ok()) return s;
  for (StageModel* chunk : chunks_) {
    FR_RETURN_IF_ERROR(SumGrads(*chunk, 0, chunk->num_params(), *transport_,
                                layout_.DataParallelGroup(), timeout_s_));
  }
  return absl::OkStatus();
}

absl::Status StageExecutor::TakeHeadLoss(double* head_loss) {
  for (StageModel* chunk : chunks_) {
    if (!chunk->stage().has_head) continue;
    absl::StatusOr<double> kept = chunk->TakeLosses();
    if (!kept.ok()) return kept.status();
    *head_loss += *kept;
  }
  return absl::OkStatus();
}

absl::Status StageExecutor::Execute(const Instr& in, const MicrobatchData& data, float loss_scale,
                                    double* head_loss, double* waited) {
  const int m = schedule_.microbatches;
  const int cell = in.chunk * m + std::max(0, in.microbatch);
  StageModel* chunk = in.chunk < static_cast<int>(chunks_.size()) ? chunks_[in.chunk] : nullptr;
  const int slot = slot_of_[cell];
  const int peer = in.peer >= 0 ? layout_.RankOf(in.peer, layout_.replica) : -1;
  switch (in.op) {
    case Op::kLoad:
      if (chunk->stage().has_embedding) {
        if (absl::Status s = chunk->SetTokens(slot, data.tokens(in.microbatch)); !s.ok()) return s;
      }
      if (chunk->stage().has_head) return chunk->SetTargets(slot, data.targets(in.microbatch));
      return absl::OkStatus();
    case Op::kRecvAct:
    case Op::kRecvGrad: {
      const bool grad = in.op == Op::kRecvGrad;
      const double start = clock().Now();
      absl::Status s = transport_->Wait((grad ? recv_grad_req_ : recv_act_req_)[cell], timeout_s_);
      CountWait(clock().Now() - start, waited);
      if (!s.ok()) return s;
      const void* src = (grad ? recv_grad_ : recv_act_)[cell].get();
      return grad ? chunk->SetOutputGrad(slot, src) : chunk->SetInputActivations(slot, src);
    }
    case Op::kForward: {
      // ZeRO-1: the chunk's parameters, gathered since the last update, are first read here.
      // Only the gather's transfer counts as waiting, not putting its values in place.
      if (buckets_ && buckets_->gathering(in.chunk)) {
        const double start = clock().Now();
        absl::Status s = buckets_->WaitGather(in.chunk, timeout_s_);
        CountWait(clock().Now() - start, waited);
        FR_RETURN_IF_ERROR(s);
        FR_RETURN_IF_ERROR(buckets_->PlaceGathered(in.chunk));
      }
      // The head's loss stays with the chunk until the step needs it (TakeHeadLoss). Every
      // forward of a schedule with backwards has its BackwardInput, at this loss scale.
      const std::optional<float> backward_scale =
          has_backward_ ? std::optional<float>(loss_scale) : std::nullopt;
      FR_RETURN_IF_ERROR(chunk->ForwardKeepingLoss(slot, backward_scale));
      return exact_timeline_ ? chunk->Drain() : absl::OkStatus();
    }
    case Op::kBackward:
    case Op::kBackwardWeight: {
      if (in.op == Op::kBackward) FR_RETURN_IF_ERROR(chunk->BackwardInput(slot, loss_scale));
      // The chunk's last weight gradients: its buckets start as they are made.
      const bool last = --weight_left_[in.chunk] == 0 && buckets_;
      if (last) buckets_->BeginLastBackward(in.chunk);
      absl::Status s = chunk->BackwardWeight(slot);
      if (s.ok() && exact_timeline_) s = chunk->Drain();
      if (last) {
        absl::Status started = buckets_->EndLastBackward(in.chunk);
        if (s.ok()) s = started;
      }
      return s;
    }
    case Op::kBackwardInput:
      FR_RETURN_IF_ERROR(chunk->BackwardInput(slot, loss_scale));
      return exact_timeline_ ? chunk->Drain() : absl::OkStatus();
    case Op::kSendAct:
    case Op::kSendGrad: {
      const bool grad = in.op == Op::kSendGrad;
      void* buf = (grad ? send_grad_ : send_act_)[cell].get();
      absl::Status got =
          grad ? chunk->GetInputGrad(slot, buf) : chunk->GetOutputActivations(slot, buf);
      if (!got.ok()) return got;
      // In device memory the chunk's copy into `buf` may still be queued: the transport's
      // stream waits for it, the host does not.
      absl::StatusOr<Transport::Request> r = transport_->IsendAfter(
          buf, MessageBytes(), peer, Tag(grad, VirtualStage(in.chunk), in.microbatch),
          chunk->MessageWritten());
      if (!r.ok()) return r.status();
      sends_.push_back(*r);
      return absl::OkStatus();
    }
    case Op::kReduceTied:
      // Posted here, summed when the gradient is next needed (REDUCE_GRADS or OPTIMIZER), as
      // the simulator models it: the wait for the other end of the pipeline then falls in the
      // cooldown BUBBLE before OPTIMIZER, where side tasks can use it. Post-validated, the
      // sum starts here: the other end may need it before this stage's step ends.
      return PostValidated() ? StartTiedSum() : absl::OkStatus();
    case Op::kReduceGrads: {
      // The head's share of wte lives outside grads() until the tied sum folds it in.
      absl::Status s = tied_reduced_        ? absl::OkStatus()
                       : tied_request_ >= 0 ? FinishTiedSum(waited)
                                            : ReduceTied(waited);
      tied_reduced_ = true;
      if (s.ok()) s = ReduceDataParallel(waited);
      return s;
    }
    case Op::kOptimizer: {
      FR_RETURN_IF_ERROR(TakeHeadLoss(head_loss));
      if (PostValidated()) return StartGlobalState(*head_loss, waited);
      // Waiting here: the tied sum when REDUCE_TIED posted it (or a one-stage schedule, which
      // has none and sums locally), then the pipeline-wide sum of the gradient norm's units.
      // Only waiting counts: the tied sum's arrival and the units' sum, not the tied
      // transfer or computing the units.
      absl::Status s = tied_reduced_ ? absl::OkStatus() : ReduceTied(waited);
      tied_reduced_ = true;
      if (s.ok() && optimizer_.units) {
        absl::StatusOr<std::vector<double>> units = optimizer_.units();
        if (!units.ok()) return units.status();
        // One value more: how many heads saw a non-finite loss (only the head's rank adds).
        units->push_back(std::isfinite(*head_loss) ? 0.0 : 1.0);
        const double start = clock().Now();
        s = transport_->AllReduceSum(units->data(), static_cast<int64_t>(units->size()),
                                     layout_.PipelineGroup(), timeout_s_);
        if (s.ok() && layout_.dp > 1) {
          // Replicas hold the same gradients but their own losses: they agree on the flag.
          s = transport_->AllReduceSum(&units->back(), 1, layout_.DataParallelGroup(), timeout_s_);
        }
        CountWait(clock().Now() - start, waited);
        const bool loss_finite = units->back() == 0.0;
        units->pop_back();
        if (s.ok()) s = optimizer_.apply(*units, loss_finite);
      }
      return s;
    }
    case Op::kBubble:
      return absl::OkStatus();  // RunStep hands bubbles to the hook
  }
  return absl::OkStatus();
}

std::function<bool()> StageExecutor::InputReady(size_t bubble_index) const {
  const std::vector<Instr>& instrs = instructions();
  size_t j = bubble_index + 1;
  while (j < instrs.size() && instrs[j].op == Op::kBubble) ++j;
  if (running_ahead_ && j == ValidationPoint(instrs) && state_request_ >= 0) {
    // Ahead of the validation point, the stage waits for the last step's global state.
    const Transport::Request r = state_request_;
    return [this, r] { return transport_->Test(r); };
  }
  if (j == instrs.size() || (instrs[j].op != Op::kRecvAct && instrs[j].op != Op::kRecvGrad)) {
    return nullptr;  // a sum: nothing to poll, the bubble's deadline is its predicted end
  }
  const Instr& in = instrs[j];
  const int cell = in.chunk * schedule_.microbatches + in.microbatch;
  const Transport::Request r = (in.op == Op::kRecvGrad ? recv_grad_req_ : recv_act_req_)[cell];
  return [this, r] { return transport_->Test(r); };
}

absl::Status StageExecutor::BeginStep(bool ahead) {
  if (PostValidated() && !groups_ready_) {
    // MPI builds a group's communicator the first time the group sums, collectively over its
    // members. A post-validated head stage starts the tied sum mid-step, while the embedding's
    // stage may still wait for this stage's gradients of another chunk: built there, the
    // communicator would wait for a rank that waits for it. One sum over each group here,
    // where every rank begins its first step, builds them in the same order everywhere.
    double token[1] = {0};
    FR_RETURN_IF_ERROR(transport_->AllReduceSum(token, 1, transport_->AllRanks(), timeout_s_));
    const int head_stage = StageOfVirtual(schedule_, NumVirtualStages() - 1);
    if (head_stage != 0 && (layout_.stage == 0 || layout_.stage == head_stage)) {
      FR_RETURN_IF_ERROR(transport_->AllReduceSum(
          token, 1,
          {layout_.RankOf(0, layout_.replica), layout_.RankOf(head_stage, layout_.replica)},
          timeout_s_));
    }
    groups_ready_ = true;
  }
  const double t0 = clock().Now();
  transport_->OnStepStart(t0);
  step_ = Progress{};
  step_.begun = true;
  step_.t0 = t0;
  step_.outcome.start_s = t0;
  tied_reduced_ = false;
  weight_left_ = weight_instrs_;
  if (buckets_) buckets_->Reset();
  if (receives_posted_) return absl::OkStatus();
  // The step's receives are posted now, into their own buffers, once the chunks are done
  // reading the last step's messages from them.
  if (!messages_allocated_) FR_RETURN_IF_ERROR(AllocateMessages());
  FR_RETURN_IF_ERROR(FinishMessageReads());
  posted_.assign(instructions().size(), false);
  return PostReceives(ahead);
}

absl::Status StageExecutor::PostReceives(bool ahead) {
  if (receives_posted_) return absl::OkStatus();
  const std::vector<Instr>& instrs = instructions();
  const size_t validation_point = ValidationPoint(instrs);
  for (size_t i = 0; i < instrs.size(); ++i) {
    const Instr& in = instrs[i];
    if (in.op != Op::kRecvAct && in.op != Op::kRecvGrad) continue;
    if (posted_[i] || (ahead && i >= validation_point && !SentAhead(in))) continue;
    FR_RETURN_IF_ERROR(PostReceive(in));
    posted_[i] = true;
  }
  receives_posted_ = !ahead;
  return absl::OkStatus();
}

absl::Status StageExecutor::PostReceive(const Instr& in) {
  const bool grad = in.op == Op::kRecvGrad;
  const int cell = in.chunk * schedule_.microbatches + in.microbatch;
  const int sender = VirtualStage(in.chunk) + (grad ? 1 : -1);
  FR_ASSIGN_OR_RETURN((grad ? recv_grad_req_ : recv_act_req_)[cell],
                      transport_->Irecv((grad ? recv_grad_ : recv_act_)[cell].get(), MessageBytes(),
                                        layout_.RankOf(in.peer, layout_.replica),
                                        Tag(grad, sender, in.microbatch)));
  return absl::OkStatus();
}

absl::Status StageExecutor::RunUntil(size_t end, const MicrobatchData& data, float loss_scale) {
  const std::vector<Instr>& instrs = instructions();
  StepOutcome& out = step_.outcome;
  const size_t validation_point = ValidationPoint(instrs);
  for (size_t i = step_.next; i < end; ++i) {
    // Post-validated: what a rollback needs is kept in a bubble long enough to hold it (after
    // the validation point: the last step's weights are final there), not on the step's path.
    if (PostValidated() && !running_ahead_ && !prepared_ && prepare_s_ >= 0 &&
        instrs[i].op == Op::kBubble && i >= validation_point &&
        instrs[i].duration_ms * 1e-3 >= prepare_s_) {
      if (absl::Status s = Prepare(); !s.ok()) return s;
    }
    // On Nsight's timeline: each instruction (a BUBBLE's holds its side work), and each bubble
    // from its start to the end of the first wait of the instruction it waits at.
    FR_NVTX_RANGE(FormatInstr(instrs[i], layout_.chunks));
    if (instrs[i].op == Op::kBubble && !nvtx_bubble_open_) {
      FR_NVTX_RANGE_START(absl::StrCat("bubble ", BubbleKindName(instrs[i].bubble)), &nvtx_bubble_);
      nvtx_bubble_open_ = true;
    }
    if (instrs[i].op == Op::kBubble && !exact_timeline_) {
      // Side work finds the device idle: the compute before the bubble has finished.
      for (StageModel* chunk : chunks_) FR_RETURN_IF_ERROR(chunk->Drain());
    }
    const double start = clock().Now();
    if (instrs[i].op == Op::kBubble && hook_ != nullptr) {
      step_.open_bubble = static_cast<int>(i);
      hook_->OnBubble(instrs[i], step_.open_bubble, start, InputReady(i));
    }
    const double waited_before = out.bubble_s;
    first_wait_s_ = -1;
    absl::Status s = Execute(instrs[i], data, loss_scale, &step_.head_loss, &out.bubble_s);
    if (buckets_) buckets_->Poll();  // the buckets' sums move on between instructions too
    // After the instruction, its waits included: for OPTIMIZER that puts its compute after
    // its sums, which the simulated runs' cost models make free (optimizer = 0).
    if (compute_ && clock().simulated()) {
      clock().Busy(ComputeMs(schedule_, *compute_, instrs[i]) * 1e-3);
    }
    // How long this instruction waited (receives, sums), and its first wait: the one the bubble
    // before it stands for. OPTIMIZER waits twice, for the tied sum's other end and, after
    // computing its norm units, for the units' sum; only the first is the bubble's. Counting
    // both made the bubble look longer by the second, side work filled that too, came late to
    // the first sum and delayed the peer (stage 1 of the 2-rank CPU pipeline: cooldown bubble
    // 5 ms plain, 11 ms harvesting, steps +2.5%).
    const double waited = out.bubble_s - waited_before;
    if (instrs[i].op != Op::kBubble) EndNvtxBubble();
    if (step_.open_bubble >= 0 && instrs[i].op != Op::kBubble) {
      hook_->OnBubbleEnd(step_.open_bubble,
                         first_wait_s_ >= 0 ? start + first_wait_s_ : clock().Now());
      step_.open_bubble = -1;
    }
    if (!s.ok()) {
      return absl::Status(
          s.code(),
          absl::StrFormat("rank %d (stage %d, replica %d) blocked on %s: %s", layout_.rank(),
                          layout_.stage, layout_.replica, Describe(instrs[i]), s.message()));
    }
    out.timeline.push_back({static_cast<int>(i), start - step_.t0, clock().Now() - step_.t0,
                            waited > 0 ? start + waited - step_.t0 : 0});
  }
  step_.next = std::max(step_.next, end);
  return absl::OkStatus();
}

absl::StatusOr<StepOutcome> StageExecutor::RunStep(const MicrobatchData& data, float loss_scale) {
  if (!step_.begun) {
    if (absl::Status s = BeginStep(); !s.ok()) return s;
  }
  // After a run ahead that the validation kept: the receives it left for after it.
  FR_RETURN_IF_ERROR(PostReceives(/*ahead=*/false));
  // Here, not at the step's start: a post-validated step that ran ahead began before the last
  // step's validation, which may still have needed that step's gradients (and the weights it
  // left, which its validation may still have changed).
  prepared_ = false;
  if (has_backward_) {
    for (StageModel* chunk : chunks_) {
      if (absl::Status s = chunk->ZeroGrads(); !s.ok()) return s;
    }
  }
  if (absl::Status s = RunUntil(instructions().size(), data, loss_scale); !s.ok()) return s;
  for (Transport::Request r : sends_) {
    absl::Status s = transport_->Wait(r, timeout_s_);
    if (!s.ok()) {
      return absl::Status(s.code(),
                          absl::StrFormat("rank %d: a send of the step never completed: %s",
                                          layout_.rank(), s.message()));
    }
  }
  sends_.clear();
  receives_posted_ = false;
  // A schedule without OPTIMIZER (forward only) takes the losses here.
  if (absl::Status s = TakeHeadLoss(&step_.head_loss); !s.ok()) return s;
  StepOutcome out = std::move(step_.outcome);
  const double head_loss = step_.head_loss, t0 = step_.t0;
  step_ = Progress{};
  const int m = schedule_.microbatches;
  if (PostValidated()) {
    out.loss = NAN;  // it comes with the global state
  } else {
    // The head's loss to every rank: the other ranks add zeros (exact), then replicas average.
    double loss[1] = {head_loss / m};
    if (layout_.stage != StageOfVirtual(schedule_, NumVirtualStages() - 1)) loss[0] = 0;
    absl::Status s = transport_->AllReduceSum(loss, 1, layout_.PipelineGroup(), timeout_s_);
    if (s.ok()) s = transport_->AllReduceSum(loss, 1, layout_.DataParallelGroup(), timeout_s_);
    if (!s.ok()) return s;
    out.loss = loss[0] / layout_.dp;
  }
  out.step_s = clock().Now() - t0;
  return out;
}

}  // namespace freeride::pipeline
