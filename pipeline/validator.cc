#include "pipeline/validator.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"
#include "pipeline/cost_model.h"
#include "pipeline/simulator.h"

namespace freeride::pipeline {
namespace {

// The instructions around (stage, position), the offending one in brackets.
std::string Grid(const Schedule& s, int stage, int position) {
  std::string out;
  const int first = std::max(0, stage - 1);
  const int last = std::min(static_cast<int>(s.per_stage.size()) - 1, stage + 1);
  for (int st = first; st <= last; ++st) {
    const auto& instrs = s.per_stage[st];
    const int from = std::max(0, position - 6);
    const int to = std::min(static_cast<int>(instrs.size()), position + 7);
    absl::StrAppend(&out, "  stage", st, ":", from > 0 ? " ..." : "");
    for (int i = from; i < to; ++i) {
      const std::string token = FormatInstr(instrs[i], s.chunks);
      absl::StrAppend(&out, " ", st == stage && i == position ? "[" + token + "]" : token);
    }
    absl::StrAppend(&out, to < static_cast<int>(instrs.size()) ? " ...\n" : "\n");
  }
  return out;
}

class Checker {
 public:
  Checker(const Schedule& s, ValidationSite* site) : s_(s), site_(site) {}

  absl::Status Fail(int stage, int position, absl::string_view rule, absl::string_view detail) {
    if (site_ != nullptr) *site_ = {stage, position};
    const auto& instrs = s_.per_stage[stage];
    std::string where =
        position < static_cast<int>(instrs.size())
            ? absl::StrCat("position ", position, " (", FormatInstr(instrs[position], s_.chunks),
                           ")")
            : absl::StrCat("end of stage");
    return absl::InvalidArgumentError(absl::StrCat("invalid schedule: stage ", stage, ", ", where,
                                                   ": rule '", rule, "': ", detail, "\n",
                                                   Grid(s_, stage, position)));
  }

  absl::Status Run() {
    if (static_cast<int>(s_.per_stage.size()) != s_.stages || s_.stages < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid schedule: rule 'shape': declares ", s_.stages, " stages but has ",
                       s_.per_stage.size(), " stage lines"));
    }
    for (int st = 0; st < s_.stages; ++st) FR_RETURN_IF_ERROR(CheckStage(st));
    FR_RETURN_IF_ERROR(CheckMatching());
    absl::StatusOr<SimResult> sim = Simulate(s_, CostModel::Uniform(1, 1, 1, 0));
    if (!sim.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid schedule: rule 'progress': ", sim.status().message()));
    }
    return absl::OkStatus();
  }

 private:
  using Key = std::pair<int, int>;  // (chunk, micro-batch)

  absl::Status CheckStage(int st) {
    const auto& instrs = s_.per_stage[st];
    const int last_virtual = s_.stages * s_.chunks - 1;
    std::map<Key, int> f_at, b_at, i_at, w_at, recv_act, recv_grad, slot, last_use;
    for (int i = 0; i < static_cast<int>(instrs.size()); ++i) {
      const Instr& in = instrs[i];
      if (in.stage != st) return Fail(st, i, "shape", absl::StrCat("names stage ", in.stage));
      if (in.op == Op::kBubble || in.op == Op::kReduceTied || in.op == Op::kReduceGrads ||
          in.op == Op::kOptimizer) {
        continue;
      }
      if (in.chunk < 0 || in.chunk >= s_.chunks) {
        return Fail(st, i, "shape", absl::StrCat("chunk ", in.chunk, " outside 0..", s_.chunks - 1));
      }
      if (in.microbatch < 0 || in.microbatch >= s_.microbatches) {
        return Fail(st, i, "shape", absl::StrCat("micro-batch ", in.microbatch, " outside 0..",
                                                 s_.microbatches - 1));
      }
      const Key key{in.chunk, in.microbatch};
      const int k = VirtualStage(s_, in);
      auto once = [&](std::map<Key, int>& seen, absl::string_view what) -> absl::Status {
        if (auto it = seen.find(key); it != seen.end()) {
          return Fail(st, i, "once", absl::StrCat(what, " already ran at position ", it->second));
        }
        seen[key] = i;
        return absl::OkStatus();
      };
      switch (in.op) {
        case Op::kForward:
          FR_RETURN_IF_ERROR(once(f_at, "this forward"));
          if (k > 0 && recv_act.count(key) == 0) {
            return Fail(st, i, "recv before use", "no RECV_F for this micro-batch before it");
          }
          break;
        case Op::kBackward:
        case Op::kBackwardInput:
          FR_RETURN_IF_ERROR(once(in.op == Op::kBackward ? b_at : i_at, "this backward"));
          if (f_at.count(key) == 0) {
            return Fail(st, i, "order", "backward before the micro-batch's forward");
          }
          if (k < last_virtual && recv_grad.count(key) == 0) {
            return Fail(st, i, "recv before use", "no RECV_B for this micro-batch before it");
          }
          break;
        case Op::kBackwardWeight:
          FR_RETURN_IF_ERROR(once(w_at, "this weight backward"));
          if (i_at.count(key) == 0) {
            return Fail(st, i, "order", "W before the micro-batch's input backward I");
          }
          break;
        case Op::kRecvAct:
          FR_RETURN_IF_ERROR(once(recv_act, "this RECV_F"));
          break;
        case Op::kRecvGrad:
          FR_RETURN_IF_ERROR(once(recv_grad, "this RECV_B"));
          break;
        case Op::kSendAct:
          if (f_at.count(key) == 0) {
            return Fail(st, i, "send after make", "SEND_F before the forward that makes it");
          }
          break;
        case Op::kSendGrad:
          if (b_at.count(key) == 0 && i_at.count(key) == 0) {
            return Fail(st, i, "send after make", "SEND_B before the backward that makes it");
          }
          break;
        default:
          break;
      }
      if (IsCompute(in.op)) last_use[key] = i;
    }
    for (int chunk = 0; chunk < s_.chunks; ++chunk) {
      for (int mb = 0; mb < s_.microbatches; ++mb) {
        const Key key{chunk, mb};
        const std::string name = absl::StrCat(mb, s_.chunks > 1 ? absl::StrCat("c", chunk) : "");
        const int end = static_cast<int>(instrs.size());
        if (f_at.count(key) == 0) return Fail(st, end, "once", absl::StrCat("F", name, " missing"));
        const bool full = b_at.count(key) > 0, split = i_at.count(key) > 0 || w_at.count(key) > 0;
        if (full && split) {
          return Fail(st, b_at[key], "once", "micro-batch has both B and the split I/W");
        }
        if (!full && !split) return Fail(st, end, "once", absl::StrCat("B", name, " missing"));
        if (split && i_at.count(key) == 0) return Fail(st, end, "once", absl::StrCat("I", name, " missing"));
        if (split && w_at.count(key) == 0) return Fail(st, end, "once", absl::StrCat("W", name, " missing"));
      }
    }
    FR_RETURN_IF_ERROR(CheckTied(st, i_at, w_at, b_at));
    return CheckBuffers(st, last_use);
  }

  // REDUCE_TIED sums the tied gradient, so it must come after what makes each share: on the
  // embedding's stage its chunk's last weight gradient (W or B); on the head's, a
  // post-validated head's last I or B (it makes its share there, in I order: the same as its
  // W order, or the sum would not be the barrier's), else its last W or B.
  absl::Status CheckTied(int st, const std::map<Key, int>& i_at, const std::map<Key, int>& w_at,
                         const std::map<Key, int>& b_at) {
    const auto& instrs = s_.per_stage[st];
    const int last_virtual = s_.stages * s_.chunks - 1;
    const bool post = s_.step_sync == StepSync::kPostValidate;
    for (int i = 0; i < static_cast<int>(instrs.size()); ++i) {
      if (instrs[i].op != Op::kReduceTied) continue;
      for (const int vs : {0, last_virtual}) {
        if (StageOfVirtual(s_, vs) != st) continue;
        const int chunk = vs / s_.stages;
        const bool head_in_i = post && vs == last_virtual;
        std::vector<std::pair<int, int>> order_i, order_w;  // (position, micro-batch)
        for (const auto* made : {&b_at, head_in_i ? &i_at : &w_at}) {
          for (const auto& [key, at] : *made) {
            if (key.first != chunk) continue;
            if (at > i) {
              return Fail(st, i, "tied",
                          absl::StrCat("the tied gradient's share of virtual "
                                       "stage ",
                                       vs,
                                       " is made after it, at "
                                       "position ",
                                       at));
            }
          }
        }
        if (!head_in_i) continue;
        for (const auto& [key, at] : i_at) {
          if (key.first == chunk) order_i.push_back({at, key.second});
        }
        for (const auto& [key, at] : w_at) {
          if (key.first == chunk) order_w.push_back({at, key.second});
        }
        std::sort(order_i.begin(), order_i.end());
        std::sort(order_w.begin(), order_w.end());
        for (size_t j = 0; j < order_i.size() && j < order_w.size(); ++j) {
          if (order_i[j].second != order_w[j].second) {
            return Fail(st, order_w[j].first, "tied",
                        "a post-validated head runs its Ws in another micro-batch order than its "
                        "Is (it makes its tied-gradient share in I order)");
          }
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status CheckBuffers(int st, const std::map<Key, int>& last_use) {
    const auto& instrs = s_.per_stage[st];
    const int slots = st < static_cast<int>(s_.buffers_per_stage.size())
                          ? s_.buffers_per_stage[st] : 0;
    std::vector<int> holder(std::max(slots, 0), -1);  // i of the F holding each slot
    std::map<Key, int> slot_of;
    for (int i = 0; i < static_cast<int>(instrs.size()); ++i) {
      const Instr& in = instrs[i];
      if (!IsCompute(in.op)) continue;
      const Key key{in.chunk, in.microbatch};
      if (in.buffer < 0 || in.buffer >= slots) {
        return Fail(st, i, "buffers", absl::StrCat("buffer ", in.buffer, " outside the stage's ",
                                                   slots, " activation slots"));
      }
      if (in.op == Op::kForward) {
        if (holder[in.buffer] >= 0) {
          return Fail(st, i, "buffers", absl::StrCat("buffer ", in.buffer, " still holds the "
                                                     "micro-batch of position ", holder[in.buffer]));
        }
        holder[in.buffer] = i;
        slot_of[key] = in.buffer;
      } else if (slot_of.count(key) > 0 && slot_of[key] != in.buffer) {
        return Fail(st, i, "buffers", absl::StrCat("uses buffer ", in.buffer, " but its forward "
                                                   "stashed into buffer ", slot_of[key]));
      }
      if (last_use.at(key) == i) holder[in.buffer] = -1;
    }
    return absl::OkStatus();
  }

  absl::Status CheckMatching() {
    const int p = s_.stages;
    // (src, dst, channel) -> keys in program order, with positions for messages.
    using Channel = std::tuple<int, int, int>;
    struct Message { int vstage, mb, stage, position; };
    std::map<Channel, std::vector<Message>> sends, recvs;
    for (int st = 0; st < p; ++st) {
      const auto& instrs = s_.per_stage[st];
      for (int i = 0; i < static_cast<int>(instrs.size()); ++i) {
        const Instr& in = instrs[i];
        const bool send = in.op == Op::kSendAct || in.op == Op::kSendGrad;
        const bool recv = in.op == Op::kRecvAct || in.op == Op::kRecvGrad;
        if (!send && !recv) continue;
        const int k = VirtualStage(s_, in);
        const bool act = in.op == Op::kSendAct || in.op == Op::kRecvAct;
        // The virtual stage on the other end, and the receiver's virtual stage.
        const int other = (in.op == Op::kSendAct || in.op == Op::kRecvGrad) ? k + 1 : k - 1;
        if (other < 0 || other >= p * s_.chunks) {
          return Fail(st, i, "matched", "no peer stage: this is the end of the pipeline");
        }
        const int peer = StageOfVirtual(s_, other);
        if (in.peer >= 0 && in.peer != peer) {
          return Fail(st, i, "matched", absl::StrCat("peer ", in.peer, " but the model chunk's "
                                                     "neighbour is on stage ", peer));
        }
        const int receiver_vstage = send ? other : k;
        const Channel channel = send ? Channel{st, peer, act} : Channel{peer, st, act};
        (send ? sends : recvs)[channel].push_back({receiver_vstage, in.microbatch, st, i});
      }
    }
    for (const auto* side : {&sends, &recvs}) {
      for (const auto& [channel, list] : *side) {
        const auto& other_side = side == &sends ? recvs : sends;
        auto it = other_side.find(channel);
        const size_t n = it == other_side.end() ? 0 : it->second.size();
        for (size_t j = 0; j < list.size(); ++j) {
          const Message& mine = list[j];
          if (j >= n) {
            return Fail(mine.stage, mine.position, "matched",
                        absl::StrCat("no matching ", side == &sends ? "RECV" : "SEND", " on stage ",
                                     side == &sends ? std::get<1>(channel) : std::get<0>(channel)));
          }
          const Message& theirs = it->second[j];
          if (theirs.vstage != mine.vstage || theirs.mb != mine.mb) {
            return Fail(mine.stage, mine.position, "channel order",
                        absl::StrCat("message ", j, " on this channel; stage ", theirs.stage,
                                     " has position ", theirs.position, " (",
                                     FormatInstr(s_.per_stage[theirs.stage][theirs.position],
                                                 s_.chunks),
                                     ") in that place"));
          }
        }
      }
    }
    return absl::OkStatus();
  }

  const Schedule& s_;
  ValidationSite* site_;
};

}  // namespace

absl::Status Validate(const Schedule& schedule, ValidationSite* site) {
  return Checker(schedule, site).Run();
}

}  // namespace freeride::pipeline
