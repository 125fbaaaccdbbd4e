#include "pipeline/grad_buckets.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"
#include "core/status.h"
#include "pipeline/device_grad_sum.h"

namespace freeride::pipeline {

int64_t BucketFloats(double mib, bool zero) {
  const double size_mb = mib > 0 || !zero ? mib : kZeroBucketMb;
  return std::max<int64_t>(1, std::llround(size_mb * (1 << 20) / sizeof(float)));
}

std::vector<GradPiece> GradPieceOrder(const ParamLayout& layout) {
  const StageSpec& stage = layout.stage;
  const int64_t L = stage.num_layers();
  std::vector<GradPiece> pieces;
  auto add = [&](ParamTensor t, int64_t layer, int part) {
    const TensorSlot& slot = layout.slot(t);
    if (!slot.present || slot.elements == 0) return;
    const int64_t per = IsPerLayer(t) ? slot.elements / L : slot.elements;
    pieces.push_back({slot.offset + (IsPerLayer(t) ? layer * per : 0), per, part});
  };
  if (stage.has_head) {
    add(ParamTensor::kLmHead, 0, 0);  // an untied head's matrix (absent in GPT-2)
    add(ParamTensor::kLnfB, 0, 0);
    add(ParamTensor::kLnfW, 0, 0);
  }
  for (int64_t l = L - 1; l >= 0; --l) {
    for (int t = static_cast<int>(ParamTensor::kFcProjB); t >= static_cast<int>(ParamTensor::kLn1W);
         --t) {
      add(static_cast<ParamTensor>(t), l, static_cast<int>(L - l));
    }
  }
  add(ParamTensor::kWpe, 0, static_cast<int>(L + 1));
  add(ParamTensor::kWte, 0, TiedPart(stage));
  return pieces;
}

std::vector<GradBucket> LayoutGradBuckets(const ParamLayout& layout, int64_t bucket_floats) {
  std::vector<GradBucket> buckets;
  for (const GradPiece& whole : GradPieceOrder(layout)) {
    GradPiece rest = whole;
    while (rest.n > 0) {
      if (buckets.empty() || buckets.back().floats == bucket_floats) buckets.emplace_back();
      GradBucket& b = buckets.back();
      const int64_t take = std::min(rest.n, bucket_floats - b.floats);
      b.pieces.push_back({rest.offset, take, rest.part});
      b.floats += take;
      b.ready_part = std::max(b.ready_part, rest.part);
      rest.offset += take;
      rest.n -= take;
    }
  }
  return buckets;
}

ZeroSplit SplitForZero(const ParamLayout& layout, int64_t bucket_floats, int dp) {
  ZeroSplit split;
  // Where the stream may be cut: at every gradient-norm chunk's start (each piece is one of
  // the norm's slices, its chunks counted from its start) and at its end.
  std::vector<int64_t> cuts;
  int64_t total = 0;
  for (const GradPiece& p : GradPieceOrder(layout)) {
    for (int64_t at = 0; at < p.n; at += kNormChunk) cuts.push_back(total + at);
    total += p.n;
  }
  cuts.push_back(total);
  split.bounds.assign(dp + 1, 0);
  split.bounds[dp] = total;
  for (int r = 1; r < dp; ++r) {
    // The cut nearest r/dp of the stream (the lower one on a tie), never before the last.
    const int64_t target = total * r / dp;
    auto it = std::lower_bound(cuts.begin(), cuts.end(), target);
    int64_t cut = *it;
    if (it != cuts.begin() && target - *std::prev(it) <= cut - target) cut = *std::prev(it);
    split.bounds[r] = std::max(cut, split.bounds[r - 1]);
  }
  split.buckets = LayoutGradBuckets(layout, bucket_floats);
  split.owned.assign(dp, {});
  int64_t at = 0;  // the stream position of the piece at hand
  for (const GradBucket& b : split.buckets) {
    std::vector<int64_t> counts(dp, 0);
    for (const GradPiece& p : b.pieces) {
      for (int r = 0; r < dp; ++r) {
        const int64_t lo = std::max(at, split.bounds[r]);
        const int64_t hi = std::min(at + p.n, split.bounds[r + 1]);
        if (hi <= lo) continue;
        counts[r] += hi - lo;
        split.owned[r].push_back({p.offset + (lo - at), hi - lo});
      }
      at += p.n;
    }
    split.counts.push_back(std::move(counts));
  }
  return split;
}

GradBuckets::GradBuckets(std::vector<StageModel*> chunks, int64_t bucket_floats,
                         Transport* transport, std::vector<int> group, bool zero)
    : transport_(transport), group_(std::move(group)), zero_(zero) {
  member_ = static_cast<int>(std::find(group_.begin(), group_.end(), transport_->rank()) -
                             group_.begin());
  for (StageModel* model : chunks) {
    Chunk c;
    c.model = model;
    if (zero_) {
      ZeroSplit split =
          SplitForZero(model->layout(), bucket_floats, static_cast<int>(group_.size()));
      c.buckets = std::move(split.buckets);
      c.counts = std::move(split.counts);
      c.owned = std::move(split.owned[member_]);
      for (const std::vector<int64_t>& counts : c.counts) {
        int64_t before = 0;
        for (int r = 0; r < member_; ++r) before += counts[r];
        c.mine_at.push_back(before);
        c.mine_n.push_back(counts[member_]);
      }
    } else {
      c.buckets = LayoutGradBuckets(model->layout(), bucket_floats);
    }
    int64_t at = 0;
    for (const GradBucket& b : c.buckets) {
      c.start.push_back(at);
      at += b.floats;
    }
    // Over NCCL a bucket sums the chunk's device gradients in place (ZeRO-1's reduce-scatter
    // as reduces onto each part's owner): no staging.
    c.on_device = SumsOnDevice(*transport_, *model);
    if (!c.on_device) c.staging.resize(at);
    if (zero_ && c.on_device) CutShares(c);
    c.requests.assign(c.buckets.size(), -1);
    chunks_.push_back(std::move(c));
  }
}

void GradBuckets::CutShares(Chunk& c) {
  for (size_t k = 0; k < c.buckets.size(); ++k) {
    std::vector<ParamRange> ranges;
    std::vector<int> roots;
    int64_t at = 0, part_end = 0;  // the piece's place in the bucket; the member's part's end
    int member = -1;
    for (const GradPiece& p : c.buckets[k].pieces) {
      for (int64_t lo = at; lo < at + p.n;) {
        while (lo >= part_end) part_end += c.counts[k][++member];
        const int64_t hi = std::min(at + p.n, part_end);
        ranges.push_back({p.offset + (lo - at), hi - lo});
        roots.push_back(member);
        lo = hi;
      }
      at += p.n;
    }
    c.share_ranges.push_back(std::move(ranges));
    c.share_roots.push_back(std::move(roots));
  }
}

void GradBuckets::Reset() {
  for (Chunk& c : chunks_) {
    c.next = 0;
    std::fill(c.requests.begin(), c.requests.end(), -1);
  }
  progress_error_ = absl::OkStatus();
}

absl::Status GradBuckets::StartReady(int index, int part) {
  Chunk& c = chunks_[index];
  if (gathering(index)) {
    return absl::InternalError(absl::StrFormat(
        "chunk %d's gradient sums would start while its parameters' all-gather is in flight "
        "(its first forward waits for it)",
        index));
  }
  if (verify_) c.sent.resize(c.staging.size());
  for (; c.next < c.buckets.size() && c.buckets[c.next].ready_part <= part; ++c.next) {
    const GradBucket& b = c.buckets[c.next];
    if (c.on_device && zero_) {
      FR_ASSIGN_OR_RETURN(
          c.requests[c.next],
          StartDeviceShares(Transport::DeviceRooted::kReduce, *c.model, c.share_ranges[c.next],
                            c.share_roots[c.next], *transport_, group_));
      continue;
    }
    if (c.on_device) {
      // The bucket's pieces where they lie in the chunk's gradients, summed in one NCCL group
      // once the chunk's stream has run the products queued so far.
      std::vector<ParamRange> ranges;
      for (const GradPiece& p : b.pieces) ranges.push_back({p.offset, p.n});
      FR_ASSIGN_OR_RETURN(c.requests[c.next],
                          StartDeviceGradSum(*c.model, ranges, *transport_, group_));
      continue;
    }
    float* packed = c.staging.data() + c.start[c.next];
    for (const GradPiece& p : b.pieces) {
      FR_ASSIGN_OR_RETURN(float* grads, c.model->HostGrads(p.offset, p.n));
      std::memcpy(packed, grads, p.n * sizeof(float));
      packed += p.n;
    }
    if (verify_) {
      std::memcpy(c.sent.data() + c.start[c.next], c.staging.data() + c.start[c.next],
                  b.floats * sizeof(float));
    }
    float* bucket = c.staging.data() + c.start[c.next];
    FR_ASSIGN_OR_RETURN(c.requests[c.next],
                        zero_ ? transport_->StartReduceScatterSum(bucket, c.counts[c.next], group_)
                              : transport_->StartAllReduceSum(bucket, b.floats, group_));
  }
  return absl::OkStatus();
}

void GradBuckets::BeginLastBackward(int chunk) {
  chunks_[chunk].model->SetWeightGradProgress([this, chunk](int part) {
    if (progress_error_.ok()) progress_error_ = StartReady(chunk, part);
    Poll();
  });
}

absl::Status GradBuckets::EndLastBackward(int chunk) {
  Chunk& c = chunks_[chunk];
  c.model->SetWeightGradProgress(nullptr);
  FR_RETURN_IF_ERROR(progress_error_);
  return StartReady(chunk, TiedPart(c.model->stage()) - 1);
}

void GradBuckets::Poll() {
  for (Chunk& c : chunks_) {
    for (size_t b = 0; b < c.next; ++b) transport_->Test(c.requests[b]);
    if (c.gathered) continue;
    for (Transport::Request r : c.gathers) transport_->Test(r);
  }
}

absl::Status GradBuckets::StartRemaining() {
  for (int c = 0; c < static_cast<int>(chunks_.size()); ++c) {
    FR_RETURN_IF_ERROR(StartReady(c, TiedPart(chunks_[c].model->stage())));
  }
  return absl::OkStatus();
}

absl::Status GradBuckets::Finish(double timeout_s) {
  for (size_t index = 0; index < chunks_.size(); ++index) {
    Chunk& c = chunks_[index];
    for (size_t k = 0; k < c.buckets.size(); ++k) {
      if (k >= c.next) return absl::InternalError("a data-parallel bucket was never started");
      FR_RETURN_IF_ERROR(transport_->Wait(c.requests[k], timeout_s));
      c.requests[k] = -1;
      if (c.on_device) continue;  // summed in place
      const float* sent = verify_ ? c.sent.data() + c.start[k] : nullptr;
      for (const GradPiece& p : c.buckets[k].pieces) {
        if (sent == nullptr) break;
        FR_ASSIGN_OR_RETURN(float* grads, c.model->HostGrads(p.offset, p.n));
        if (std::memcmp(grads, sent, p.n * sizeof(float)) != 0) {
          return absl::InternalError(absl::StrFormat(
              "data-parallel bucket %d of chunk %d started before its gradients were final: "
              "elements [%d, %d) changed after its sum began",
              k, index, p.offset, p.offset + p.n));
        }
        sent += p.n;
      }
      // ZeRO-1: only this rank's part of the bucket was summed here.
      FR_RETURN_IF_ERROR(zero_ ? CopyPart(c, k, c.mine_at[k], c.mine_n[k], false, false)
                               : CopyPart(c, k, 0, c.buckets[k].floats, false, false));
    }
  }
  return absl::OkStatus();
}

absl::Status GradBuckets::CopyPart(Chunk& c, size_t k, int64_t from, int64_t n, bool params,
                                   bool to_packed) {
  float* packed = c.staging.data() + c.start[k];
  int64_t at = 0;  // the piece's place in the bucket
  for (const GradPiece& p : c.buckets[k].pieces) {
    const int64_t lo = std::max(at, from), hi = std::min(at + p.n, from + n);
    if (hi > lo) {
      const int64_t offset = p.offset + (lo - at);
      FR_ASSIGN_OR_RETURN(float* values, params ? c.model->HostParams(offset, hi - lo)
                                                : c.model->HostGrads(offset, hi - lo));
      if (to_packed) {
        std::memcpy(packed + lo, values, (hi - lo) * sizeof(float));
      } else {
        std::memcpy(values, packed + lo, (hi - lo) * sizeof(float));
        FR_RETURN_IF_ERROR(params ? c.model->CommitHostParams(offset, hi - lo)
                                  : c.model->CommitHostGrads(offset, hi - lo));
      }
    }
    at += p.n;
  }
  return absl::OkStatus();
}

absl::Status GradBuckets::StartGather() {
  if (!zero_) return absl::FailedPreconditionError("parameters are gathered only under ZeRO-1");
  for (size_t index = 0; index < chunks_.size(); ++index) {
    if (gathering(static_cast<int>(index))) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "chunk %d's parameters are still being gathered from the last update", index));
    }
  }
  for (Chunk& c : chunks_) {
    c.gathers.assign(c.buckets.size(), -1);
    for (size_t k = 0; k < c.buckets.size(); ++k) {
      if (c.on_device) {  // in place: each part from its owner's device parameters
        FR_ASSIGN_OR_RETURN(c.gathers[k], StartDeviceShares(Transport::DeviceRooted::kBroadcast,
                                                            *c.model, c.share_ranges[k],
                                                            c.share_roots[k], *transport_, group_));
        continue;
      }
      FR_RETURN_IF_ERROR(CopyPart(c, k, c.mine_at[k], c.mine_n[k], true, true));
      FR_ASSIGN_OR_RETURN(c.gathers[k], transport_->StartAllGather(c.staging.data() + c.start[k],
                                                                   c.counts[k], group_));
    }
  }
  return absl::OkStatus();
}

absl::Status GradBuckets::WaitGather(int chunk, double timeout_s) {
  Chunk& c = chunks_[chunk];
  if (c.gathered) return absl::OkStatus();
  for (Transport::Request r : c.gathers) FR_RETURN_IF_ERROR(transport_->Wait(r, timeout_s));
  c.gathered = !c.gathers.empty();
  return absl::OkStatus();
}

absl::Status GradBuckets::PlaceGathered(int chunk) {
  Chunk& c = chunks_[chunk];
  if (!c.gathered) {
    return absl::FailedPreconditionError(
        absl::StrFormat("chunk %d: no all-gather waited for to place", chunk));
  }
  // On the device the broadcasts wrote the weights in place: nothing is left to do there.
  for (size_t k = 0; k < c.buckets.size() && !c.on_device; ++k) {
    FR_RETURN_IF_ERROR(CopyPart(c, k, 0, c.buckets[k].floats, true, false));
  }
  c.gathers.clear();
  c.gathered = false;
  return absl::OkStatus();
}

absl::Status GradBuckets::FinishGather(double timeout_s) {
  for (int c = 0; c < static_cast<int>(chunks_.size()); ++c) {
    if (!gathering(c)) continue;
    FR_RETURN_IF_ERROR(WaitGather(c, timeout_s));
    FR_RETURN_IF_ERROR(PlaceGathered(c));
  }
  return absl::OkStatus();
}

}  // namespace freeride::pipeline
