// The data-parallel gradient sum in buckets (parallel.dp_bucket_mb), overlapped with the
// step's last backward. Each model chunk's weight gradients are listed in the order its
// backward makes them final and cut into buckets of a fixed size; a bucket's non-blocking sum
// over the data-parallel group starts as soon as the chunk's last weight-gradient instruction
// (its last B, or W in zero-bubble schedules) has written every element of it, and
// REDUCE_GRADS waits for them all. Each element is summed once, over the same dp values as the
// unbucketed sum of the whole buffer: the layout moves where an element travels, not what is
// added (docs/training.md#data-parallel-buckets).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "models/gpt2_config.h"
#include "models/stage_model.h"
#include "pipeline/comm/transport.h"

namespace freeride::pipeline {

// Elements [offset, offset + n) of a chunk's gradient buffer, final once the chunk's last
// BackwardWeight has reported `part` (StageModel::SetWeightGradProgress's numbering).
struct GradPiece {
  int64_t offset = 0, n = 0;
  int part = 0;
};

// One all-reduce: its pieces packed back to back, in order.
struct GradBucket {
  std::vector<GradPiece> pieces;
  int64_t floats = 0;
  int ready_part = 0;  // the latest part among its pieces: the bucket starts after it
};

// ZeRO-1's bucket size where parallel.dp_bucket_mb is 0, MiB.
inline constexpr double kZeroBucketMb = 4;

// A bucket's floats for parallel.dp_bucket_mb = `mib` (ZeRO-1's kZeroBucketMb where it is 0).
int64_t BucketFloats(double mib, bool zero);

// wte's part: after every part the backward reports (the tied sum adds to it at REDUCE_GRADS).
inline int TiedPart(const StageSpec& stage) { return static_cast<int>(stage.num_layers()) + 2; }

// The chunk's tensors in the order BackwardWeight finishes them, whole (a per-layer tensor one
// piece per layer): the stream the buckets cut.
std::vector<GradPiece> GradPieceOrder(const ParamLayout& layout);

// The fixed layout: the chunk's tensors in the order BackwardWeight finishes them (the final
// LayerNorm's lnf_b, lnf_w; then each block from the last, its tensors in reverse llm.c order,
// fc_proj_b first, ln1_w last; then wpe; then wte, after the tied sum), cut into consecutive
// buckets of `bucket_floats` (the last one shorter); a tensor may be split between two.
std::vector<GradBucket> LayoutGradBuckets(const ParamLayout& layout, int64_t bucket_floats);

// ZeRO-1 (parallel.zero = 1): the chunk's gradient stream (GradPieceOrder) cut into one
// contiguous share per data-parallel member, in member order, each as near 1/dp of the stream
// as the gradient norm's chunks allow (a share holds whole ones: models/grad_norm.h), and
// what that makes of the buckets.
struct ZeroSplit {
  std::vector<int64_t> bounds;                 // dp + 1 stream positions, from 0 to the total
  std::vector<GradBucket> buckets;             // LayoutGradBuckets's
  std::vector<std::vector<int64_t>> counts;    // [bucket][member]: each member's part of it
  std::vector<std::vector<ParamRange>> owned;  // [member]: its share, in stream order
};
ZeroSplit SplitForZero(const ParamLayout& layout, int64_t bucket_floats, int dp);

class GradBuckets {
 public:
  // `group`: the data-parallel group (this rank's stage in every replica), at least 2 ranks.
  // `zero`: ZeRO-1, each bucket's sum a reduce-scatter (SplitForZero), this rank keeping the
  // summed gradients of its share only: through the host, or over a transport that carries
  // device memory one reduce per member's part onto that member, in place on the chunk's
  // device gradients (and the all-gather one broadcast per part from its owner, in place on
  // the device parameters).
  GradBuckets(std::vector<StageModel*> chunks, int64_t bucket_floats, Transport* transport,
              std::vector<int> group, bool zero = false);
  bool zero() const { return zero_; }
  // ZeRO-1: this rank's share of chunk `chunk`'s parameters (layout offsets, stream order).
  const std::vector<ParamRange>& owned(int chunk) const { return chunks_[chunk].owned; }
  // ZeRO-1: after each member has stepped its share, every member's parameters whole again:
  // one all-gather per bucket over the group, every chunk's started here (none may be in
  // flight). A chunk's parameters are whole once WaitGather and PlaceGathered have run for it;
  // until then nothing may read or write them, nor start the chunk's gradient sums (they share
  // the buckets' staging).
  absl::Status StartGather();
  bool gathering(int chunk) const { return !chunks_[chunk].gathers.empty(); }
  // Waits for chunk `chunk`'s all-gathers (none in flight: at once)...
  absl::Status WaitGather(int chunk, double timeout_s);
  // ...and then puts what they brought into its parameters.
  absl::Status PlaceGathered(int chunk);
  // Both, for every chunk.
  absl::Status FinishGather(double timeout_s);

  // A check for tests: every bucket's gradients are compared, when its sum is waited for,
  // with what they were when it started (an error if any changed: the bucket started before
  // its gradients were final). Host sums only: a device sum writes its result in place.
  void set_verify(bool verify) { verify_ = verify; }
  const std::vector<GradBucket>& buckets(int chunk) const { return chunks_[chunk].buckets; }

  // A new step: no bucket started.
  void Reset();
  // Around the chunk's last weight-gradient instruction: its buckets start as the backward
  // reports their parts final, and when it returns those ready then (all but wte's).
  void BeginLastBackward(int chunk);
  absl::Status EndLastBackward(int chunk);
  // Makes progress on the sums in flight (MPI moves a non-blocking sum on inside its calls).
  void Poll();
  // REDUCE_GRADS, after the tied sum: starts what is left (wte's buckets), every chunk in
  // order.
  absl::Status StartRemaining();
  // Waits for every bucket and puts the sums back into the chunks' gradients.
  absl::Status Finish(double timeout_s);

 private:
  struct Chunk {
    StageModel* model = nullptr;
    std::vector<GradBucket> buckets;
    std::vector<int64_t> start;        // each bucket's place in `staging`
    bool on_device = false;            // summed in place on the device (device_grad_sum.h)
    // Host sums: the packed buckets; `sent`: their contributions (verify).
    std::vector<float> staging, sent;
    std::vector<Transport::Request> requests;
    size_t next = 0;  // the first bucket not started
    // ZeRO-1: each bucket's parts by member, and this rank's part and share.
    std::vector<std::vector<int64_t>> counts;
    std::vector<int64_t> mine_at, mine_n;  // per bucket, within it
    // ZeRO-1 on the device: each bucket's pieces cut at the members' parts (layout offsets),
    // and each cut's owner (its place in the group).
    std::vector<std::vector<ParamRange>> share_ranges;
    std::vector<std::vector<int>> share_roots;
    std::vector<ParamRange> owned;
    // ZeRO-1: the parameters' all-gathers in flight, one per bucket (empty: none); `gathered`:
    // all of them waited for, not yet placed.
    std::vector<Transport::Request> gathers;
    bool gathered = false;
  };
  // Copies the pieces of chunk `c`'s bucket `k` that lie in [from, from + n) of the bucket
  // between the chunk's buffer (`get`: its gradients or parameters) and `packed` (the
  // bucket's place in staging); `to_packed` says which way.
  absl::Status CopyPart(Chunk& c, size_t k, int64_t from, int64_t n, bool params, bool to_packed);
  // ZeRO-1 on the device: fills c.share_ranges and c.share_roots from its buckets and counts.
  void CutShares(Chunk& c);
  // Starts chunk `c`'s buckets in order while they are ready after `part`.
  absl::Status StartReady(int c, int part);

  std::vector<Chunk> chunks_;
  Transport* transport_;
  std::vector<int> group_;
  bool verify_ = false;
  bool zero_ = false;
  int member_ = 0;               // this rank's place in the group
  absl::Status progress_error_;  // an error inside the backward's progress callback
};

}  // namespace freeride::pipeline
