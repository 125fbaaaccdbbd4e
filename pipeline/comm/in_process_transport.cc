// Ranks as threads of one process, for tests: messages go through per-(source, destination,
// tag) queues; sums collect every member's contribution and add them in rank order (a
// reduce-scatter too, each member then taking its part; an all-gather takes each element from
// the member whose part it is).
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "pipeline/comm/transport.h"

namespace freeride::pipeline {
namespace {

struct Message {
  std::vector<char> bytes;
};

// State shared by every rank of the world.
struct Hub {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::tuple<int, int, int>, std::deque<Message>> queues;  // (src, dst, tag)
  struct Reduction {
    std::map<int, std::vector<double>> contributions;  // rank → values (widened)
    std::vector<double> result;
    bool done = false;
    int taken = 0;
  };
  // By group and the sum's number in it: each member counts the sums it starts on a group.
  std::map<std::pair<std::vector<int>, int64_t>, Reduction> reductions;
};

class InProcessTransport : public Transport {
 public:
  InProcessTransport(std::shared_ptr<Hub> hub, int rank, int size)
      : hub_(std::move(hub)), rank_(rank), size_(size) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::StatusOr<Request> Isend(const void* data, int64_t bytes, int peer, int tag) override {
    Message m;
    m.bytes.assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
    {
      std::lock_guard<std::mutex> lock(hub_->mu);
      hub_->queues[{rank_, peer, tag}].push_back(std::move(m));
    }
    hub_->cv.notify_all();
    pending_[next_] = {};  // a send completes at once (the bytes were copied)
    return next_++;
  }

  absl::StatusOr<Request> Irecv(void* data, int64_t bytes, int peer, int tag) override {
    Pending p;
    p.data = data;
    p.bytes = bytes;
    p.peer = peer;
    p.tag = tag;
    p.is_recv = true;
    pending_[next_] = std::move(p);
    return next_++;
  }

  absl::Status Wait(Request request, double timeout_s) override {
    auto it = pending_.find(request);
    if (it == pending_.end()) return absl::InvalidArgumentError("unknown request");
    const Pending p = it->second;
    if (p.sum) return FinishSum(it, timeout_s);
    pending_.erase(it);
    if (!p.is_recv) return absl::OkStatus();
    std::unique_lock<std::mutex> lock(hub_->mu);
    auto& queue = hub_->queues[{p.peer, rank_, p.tag}];
    if (!hub_->cv.wait_for(lock, std::chrono::duration<double>(timeout_s),
                           [&] { return !queue.empty(); })) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "receive of %d bytes from rank %d (tag %d) did not complete within %.1f s", p.bytes,
          p.peer, p.tag, timeout_s));
    }
    Message m = std::move(queue.front());
    queue.pop_front();
    if (static_cast<int64_t>(m.bytes.size()) != p.bytes) {
      return absl::InternalError(absl::StrFormat("rank %d sent %d bytes, %d expected", p.peer,
                                                 m.bytes.size(), p.bytes));
    }
    std::memcpy(p.data, m.bytes.data(), m.bytes.size());
    return absl::OkStatus();
  }

  bool Test(Request request) override {
    auto it = pending_.find(request);
    if (it == pending_.end()) return false;
    const Pending& p = it->second;
    std::lock_guard<std::mutex> lock(hub_->mu);
    if (p.sum) {
      if (p.group.size() <= 1) return true;
      auto r = hub_->reductions.find({p.group, p.seq});
      return r != hub_->reductions.end() && r->second.done;
    }
    if (!p.is_recv) return true;
    auto q = hub_->queues.find({p.peer, rank_, p.tag});
    return q != hub_->queues.end() && !q->second.empty();
  }

  absl::Status AllReduceSum(float* data, int64_t n, const std::vector<int>& group,
                            double timeout_s) override {
    absl::StatusOr<Request> r = StartAllReduceSum(data, n, group);
    return r.ok() ? Wait(*r, timeout_s) : r.status();
  }
  absl::Status AllReduceSum(double* data, int64_t n, const std::vector<int>& group,
                            double timeout_s) override {
    absl::StatusOr<Request> r = StartAllReduceSum(data, n, group);
    return r.ok() ? Wait(*r, timeout_s) : r.status();
  }
  absl::StatusOr<Request> StartAllReduceSum(float* data, int64_t n,
                                            const std::vector<int>& group) override {
    return Start(data, n, /*is_double=*/false, group);
  }
  absl::StatusOr<Request> StartAllReduceSum(double* data, int64_t n,
                                            const std::vector<int>& group) override {
    return Start(data, n, /*is_double=*/true, group);
  }
  absl::StatusOr<Request> StartReduceScatterSum(float* data, const std::vector<int64_t>& counts,
                                                const std::vector<int>& group) override {
    return Start(data, Total(counts), /*is_double=*/false, group, Kind::kReduceScatter, counts);
  }
  absl::StatusOr<Request> StartAllGather(float* data, const std::vector<int64_t>& counts,
                                         const std::vector<int>& group) override {
    return Start(data, Total(counts), /*is_double=*/false, group, Kind::kAllGather, counts);
  }

 private:
  enum class Kind { kSum, kReduceScatter, kAllGather };
  static int64_t Total(const std::vector<int64_t>& counts) {
    int64_t n = 0;
    for (int64_t c : counts) n += c;
    return n;
  }
  // Where this rank's part starts and how long it is, by its place in the group.
  std::pair<int64_t, int64_t> OwnPart(const std::vector<int>& group,
                                      const std::vector<int64_t>& counts) const {
    int64_t at = 0;
    for (size_t k = 0; k < group.size(); ++k) {
      if (group[k] == rank_) return {at, k < counts.size() ? counts[k] : 0};
      at += k < counts.size() ? counts[k] : 0;
    }
    return {0, 0};
  }

  struct Pending {
    void* data = nullptr;
    int64_t bytes = 0;
    int peer = -1, tag = 0;
    bool is_recv = false;
    // A sum: its group, its number there, `bytes` / element size values of float or double.
    bool sum = false, is_double = false;
    std::vector<int> group;
    int64_t seq = 0;
    Kind kind = Kind::kSum;
    std::vector<int64_t> counts;  // a reduce-scatter's or all-gather's parts
  };

  // Contributes this rank's values; the last member to contribute adds them all, in rank
  // order and in the element type: the same arithmetic MPI does for two ranks.
  absl::StatusOr<Request> Start(void* data, int64_t n, bool is_double,
                                const std::vector<int>& group, Kind kind = Kind::kSum,
                                const std::vector<int64_t>& counts = {}) {
    if (kind != Kind::kSum && counts.size() != group.size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%d parts for a group of %d ranks", counts.size(), group.size()));
    }
    Pending p;
    p.data = data;
    p.bytes = n * (is_double ? 8 : 4);
    p.sum = true;
    p.is_double = is_double;
    p.group = group;
    p.kind = kind;
    p.counts = counts;
    if (group.size() > 1) {
      p.seq = seq_[group]++;
      std::lock_guard<std::mutex> lock(hub_->mu);
      Hub::Reduction& r = hub_->reductions[{group, p.seq}];
      std::vector<double>& mine = r.contributions[rank_];
      mine.resize(n);
      for (int64_t i = 0; i < n; ++i) {
        mine[i] = is_double ? static_cast<double*>(data)[i] : static_cast<float*>(data)[i];
      }
      if (r.contributions.size() == group.size()) {
        r.result = kind == Kind::kAllGather ? Gather(r, group, counts)
                   : is_double              ? Add<double>(r, n)
                                            : Add<float>(r, n);
        r.contributions.clear();
        r.done = true;
        hub_->cv.notify_all();
      }
    }
    pending_[next_] = std::move(p);
    return next_++;
  }

  template <typename T>
  static std::vector<double> Add(const Hub::Reduction& r, int64_t n) {
    std::vector<T> sum(n, T{0});
    bool first = true;
    for (const auto& [member, values] : r.contributions) {
      for (int64_t i = 0; i < n; ++i) {
        sum[i] = first ? static_cast<T>(values[i]) : sum[i] + static_cast<T>(values[i]);
      }
      first = false;
    }
    return std::vector<double>(sum.begin(), sum.end());
  }

  // Each element from the member whose part holds it.
  static std::vector<double> Gather(const Hub::Reduction& r, const std::vector<int>& group,
                                    const std::vector<int64_t>& counts) {
    std::vector<double> all;
    for (size_t k = 0; k < group.size(); ++k) {
      const std::vector<double>& theirs = r.contributions.at(group[k]);
      const int64_t at = static_cast<int64_t>(all.size());
      all.insert(all.end(), theirs.begin() + at, theirs.begin() + at + counts[k]);
    }
    return all;
  }

  absl::Status FinishSum(std::map<Request, Pending>::iterator it, double timeout_s) {
    const Pending p = it->second;
    if (p.group.size() <= 1) {
      pending_.erase(it);
      return absl::OkStatus();
    }
    std::unique_lock<std::mutex> lock(hub_->mu);
    Hub::Reduction& r = hub_->reductions[{p.group, p.seq}];
    if (!hub_->cv.wait_for(lock, std::chrono::duration<double>(timeout_s),
                           [&] { return r.done; })) {
      return absl::DeadlineExceededError(
          absl::StrFormat("sum over ranks {%s} did not complete within %.1f s",
                          absl::StrJoin(p.group, ","), timeout_s));
    }
    int64_t first = 0, n = p.bytes / (p.is_double ? 8 : 4);
    if (p.kind == Kind::kReduceScatter) {
      std::tie(first, n) = OwnPart(p.group, p.counts);
      n += first;
    }
    for (int64_t i = first; i < n; ++i) {
      if (p.is_double) {
        static_cast<double*>(p.data)[i] = r.result[i];
      } else {
        static_cast<float*>(p.data)[i] = static_cast<float>(r.result[i]);
      }
    }
    if (++r.taken == static_cast<int>(p.group.size())) hub_->reductions.erase({p.group, p.seq});
    pending_.erase(it);
    return absl::OkStatus();
  }

  std::shared_ptr<Hub> hub_;
  int rank_, size_;
  Request next_ = 0;
  std::map<Request, Pending> pending_;
  std::map<std::vector<int>, int64_t> seq_;  // sums this rank started, per group
};

class SelfTransport : public Transport {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  absl::StatusOr<Request> Isend(const void*, int64_t, int peer, int) override {
    return absl::FailedPreconditionError(absl::StrFormat("send to rank %d in a world of 1", peer));
  }
  absl::StatusOr<Request> Irecv(void*, int64_t, int peer, int) override {
    return absl::FailedPreconditionError(
        absl::StrFormat("receive from rank %d in a world of 1", peer));
  }
  // Only sums make requests here, and they are done when started.
  absl::Status Wait(Request request, double) override {
    if (sums_.erase(request) == 0) {
      return absl::FailedPreconditionError("no such request in a world of 1");
    }
    return absl::OkStatus();
  }
  bool Test(Request request) override { return sums_.count(request) > 0; }
  absl::Status AllReduceSum(float*, int64_t, const std::vector<int>&, double) override {
    return absl::OkStatus();
  }
  absl::Status AllReduceSum(double*, int64_t, const std::vector<int>&, double) override {
    return absl::OkStatus();
  }
  absl::StatusOr<Request> StartAllReduceSum(float*, int64_t, const std::vector<int>&) override {
    sums_.insert(next_);
    return next_++;
  }
  absl::StatusOr<Request> StartAllReduceSum(double*, int64_t, const std::vector<int>&) override {
    sums_.insert(next_);
    return next_++;
  }

 private:
  std::set<Request> sums_;
  Request next_ = 0;
};

}  // namespace

std::unique_ptr<Transport> MakeSelfTransport() { return std::make_unique<SelfTransport>(); }

std::vector<std::unique_ptr<Transport>> MakeInProcessWorld(int size) {
  auto hub = std::make_shared<Hub>();
  std::vector<std::unique_ptr<Transport>> world;
  for (int r = 0; r < size; ++r) world.push_back(std::make_unique<InProcessTransport>(hub, r, size));
  return world;
}

}  // namespace freeride::pipeline
