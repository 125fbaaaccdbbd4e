#include "pipeline/grad_buckets.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "core/status.h"

namespace freeride::pipeline {

std::vector<GradBucket> LayoutGradBuckets(const ParamLayout& layout, int64_t bucket_floats) {
  const StageSpec& stage = layout.stage;
  const int64_t L = stage.num_layers();
  // The pieces in the order their gradients become final.
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

  std::vector<GradBucket> buckets;
  for (const GradPiece& whole : pieces) {
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

GradBuckets::GradBuckets(std::vector<StageModel*> chunks, int64_t bucket_floats,
                         Transport* transport, std::vector<int> group)
    : transport_(transport), group_(std::move(group)) {
  for (StageModel* model : chunks) {
    Chunk c;
    c.model = model;
    c.buckets = LayoutGradBuckets(model->layout(), bucket_floats);
    int64_t at = 0;
    for (const GradBucket& b : c.buckets) {
      c.start.push_back(at);
      at += b.floats;
    }
    c.staging.resize(at);
    c.requests.assign(c.buckets.size(), -1);
    chunks_.push_back(std::move(c));
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
  if (verify_) c.sent.resize(c.staging.size());
  for (; c.next < c.buckets.size() && c.buckets[c.next].ready_part <= part; ++c.next) {
    const GradBucket& b = c.buckets[c.next];
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
    FR_ASSIGN_OR_RETURN(
        c.requests[c.next],
        transport_->StartAllReduceSum(c.staging.data() + c.start[c.next], b.floats, group_));
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
      const float* summed = c.staging.data() + c.start[k];
      const float* sent = verify_ ? c.sent.data() + c.start[k] : nullptr;
      for (const GradPiece& p : c.buckets[k].pieces) {
        FR_ASSIGN_OR_RETURN(float* grads, c.model->HostGrads(p.offset, p.n));
        if (sent != nullptr && std::memcmp(grads, sent, p.n * sizeof(float)) != 0) {
          return absl::InternalError(absl::StrFormat(
              "data-parallel bucket %d of chunk %d started before its gradients were final: "
              "elements [%d, %d) changed after its sum began",
              k, index, p.offset, p.offset + p.n));
        }
        std::memcpy(grads, summed, p.n * sizeof(float));
        FR_RETURN_IF_ERROR(c.model->CommitHostGrads(p.offset, p.n));
        summed += p.n;
        if (sent != nullptr) sent += p.n;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace freeride::pipeline
