// Ranks as threads of one process, for tests: messages go through per-(source, destination,
// tag) queues; sums collect every member's contribution and add them in rank order.
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

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
    int taken = 0;
  };
  std::map<std::vector<int>, Reduction> reductions;  // one in flight per group
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
    pending_[next_] = {data, bytes, peer, tag, true};
    return next_++;
  }

  absl::Status Wait(Request request, double timeout_s) override {
    auto it = pending_.find(request);
    if (it == pending_.end()) return absl::InvalidArgumentError("unknown request");
    const Pending p = it->second;
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
    if (!it->second.is_recv) return true;
    std::lock_guard<std::mutex> lock(hub_->mu);
    auto q = hub_->queues.find({it->second.peer, rank_, it->second.tag});
    return q != hub_->queues.end() && !q->second.empty();
  }

  absl::Status AllReduceSum(float* data, int64_t n, const std::vector<int>& group,
                            double timeout_s) override {
    return Reduce(data, n, group, timeout_s);
  }
  absl::Status AllReduceSum(double* data, int64_t n, const std::vector<int>& group,
                            double timeout_s) override {
    return Reduce(data, n, group, timeout_s);
  }

 private:
  struct Pending {
    void* data = nullptr;
    int64_t bytes = 0;
    int peer = -1, tag = 0;
    bool is_recv = false;
  };

  template <typename T>
  absl::Status Reduce(T* data, int64_t n, const std::vector<int>& group, double timeout_s) {
    if (group.size() <= 1) return absl::OkStatus();
    const auto timeout = std::chrono::duration<double>(timeout_s);
    std::unique_lock<std::mutex> lock(hub_->mu);
    // Wait for the previous sum over this group to be fully taken.
    if (!hub_->cv.wait_for(lock, timeout, [&] {
          auto it = hub_->reductions.find(group);
          return it == hub_->reductions.end() || it->second.result.empty();
        })) {
      return Timeout(group, timeout_s);
    }
    Hub::Reduction& r = hub_->reductions[group];
    r.contributions[rank_].assign(data, data + n);
    if (r.contributions.size() == group.size()) {
      // Rank order, in the element type: the same arithmetic MPI does for two ranks.
      std::vector<T> sum(n, T{0});
      bool first = true;
      for (auto& [member, values] : r.contributions) {
        for (int64_t i = 0; i < n; ++i) {
          sum[i] = first ? static_cast<T>(values[i]) : sum[i] + static_cast<T>(values[i]);
        }
        first = false;
      }
      r.result.assign(sum.begin(), sum.end());
      r.contributions.clear();
      hub_->cv.notify_all();
    } else if (!hub_->cv.wait_for(lock, timeout, [&] { return !r.result.empty(); })) {
      return Timeout(group, timeout_s);
    }
    for (int64_t i = 0; i < n; ++i) data[i] = static_cast<T>(r.result[i]);
    if (++r.taken == static_cast<int>(group.size())) hub_->reductions.erase(group);
    hub_->cv.notify_all();
    return absl::OkStatus();
  }

  absl::Status Timeout(const std::vector<int>& group, double timeout_s) {
    return absl::DeadlineExceededError(absl::StrFormat(
        "sum over ranks {%s} did not complete within %.1f s", absl::StrJoin(group, ","),
        timeout_s));
  }

  std::shared_ptr<Hub> hub_;
  int rank_, size_;
  Request next_ = 0;
  std::map<Request, Pending> pending_;
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
  absl::Status Wait(Request, double) override {
    return absl::FailedPreconditionError("no requests in a world of 1");
  }
  bool Test(Request) override { return false; }
  absl::Status AllReduceSum(float*, int64_t, const std::vector<int>&, double) override {
    return absl::OkStatus();
  }
  absl::Status AllReduceSum(double*, int64_t, const std::vector<int>&, double) override {
    return absl::OkStatus();
  }
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
