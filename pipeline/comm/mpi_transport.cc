#include <mpi.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/mpi_check.h"
#include "core/timer.h"
#include "pipeline/comm/transport.h"

namespace freeride::pipeline {
namespace {

// Polls `request` until done or the deadline. Sleeps between polls (backing off to 1 ms) so
// that a waiting rank leaves the core to computing ranks when they share cores.
absl::Status PollUntilDone(MPI_Request* request, double timeout_s, const std::string& what) {
  const double deadline = MonotonicSeconds() + timeout_s;
  auto pause = std::chrono::microseconds(20);
  while (true) {
    int done = 0;
    MPI_CHECK(MPI_Test(request, &done, MPI_STATUS_IGNORE));
    if (done) return absl::OkStatus();
    if (MonotonicSeconds() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrFormat("%s did not complete within %.1f s", what, timeout_s));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

class MpiTransport : public Transport {
 public:
  MpiTransport() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiTransport() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;  // the communicators went with MPI
    for (auto& [group, comm] : comms_) MPI_Comm_free(&comm);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::StatusOr<Request> Isend(const void* data, int64_t bytes, int peer, int tag) override {
    MPI_Request r;
    MPI_CHECK(MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, MPI_COMM_WORLD, &r));
    return Store({r}, absl::StrFormat("send of %d bytes to rank %d (tag %d)", bytes, peer, tag));
  }

  absl::StatusOr<Request> Irecv(void* data, int64_t bytes, int peer, int tag) override {
    MPI_Request r;
    MPI_CHECK(MPI_Irecv(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, MPI_COMM_WORLD, &r));
    return Store({r},
                 absl::StrFormat("receive of %d bytes from rank %d (tag %d)", bytes, peer, tag));
  }

  absl::Status Wait(Request request, double timeout_s) override {
    auto it = requests_.find(request);
    if (it == requests_.end()) return absl::InvalidArgumentError("unknown request");
    for (MPI_Request& r : it->second.pieces) {
      absl::Status s = PollUntilDone(&r, timeout_s, it->second.what);
      if (!s.ok()) return s;
    }
    if (it->second.then) it->second.then();
    requests_.erase(it);
    return absl::OkStatus();
  }

  bool Test(Request request) override {
    auto it = requests_.find(request);
    if (it == requests_.end()) return false;
    std::vector<MPI_Request>& pieces = it->second.pieces;
    if (pieces.empty()) return true;
    int done = 0;
    MPI_Testall(static_cast<int>(pieces.size()), pieces.data(), &done, MPI_STATUSES_IGNORE);
    return done != 0;
  }

  absl::Status AllReduceSum(float* data, int64_t n, const std::vector<int>& group,
                            double timeout_s) override {
    absl::StatusOr<Request> r = Start(data, n, MPI_FLOAT, group);
    return r.ok() ? Wait(*r, timeout_s) : r.status();
  }
  absl::Status AllReduceSum(double* data, int64_t n, const std::vector<int>& group,
                            double timeout_s) override {
    absl::StatusOr<Request> r = Start(data, n, MPI_DOUBLE, group);
    return r.ok() ? Wait(*r, timeout_s) : r.status();
  }
  absl::StatusOr<Request> StartAllReduceSum(float* data, int64_t n,
                                            const std::vector<int>& group) override {
    return Start(data, n, MPI_FLOAT, group);
  }
  absl::StatusOr<Request> StartAllReduceSum(double* data, int64_t n,
                                            const std::vector<int>& group) override {
    return Start(data, n, MPI_DOUBLE, group);
  }

  // In place: MPI_Ireduce_scatter leaves a member's sum at the start of its buffer, moved to
  // the part's own place once the request completes. For 2 members each element is one
  // addition, the all-reduce's; for more, Open MPI's algorithms choose the order, as they do
  // for the all-reduce.
  absl::StatusOr<Request> StartReduceScatterSum(float* data, const std::vector<int64_t>& counts,
                                                const std::vector<int>& group) override {
    return StartParts(data, counts, group, /*gather=*/false);
  }
  absl::StatusOr<Request> StartAllGather(float* data, const std::vector<int64_t>& counts,
                                         const std::vector<int>& group) override {
    return StartParts(data, counts, group, /*gather=*/true);
  }

 private:
  // A request is one MPI request, or several for a sum in pieces (none: nothing to wait for),
  // and what to do once they are done.
  struct Pending {
    std::vector<MPI_Request> pieces;
    std::string what;
    std::function<void()> then;
  };
  Request Store(std::vector<MPI_Request> pieces, std::string what,
                std::function<void()> then = nullptr) {
    requests_[next_] = {std::move(pieces), std::move(what), std::move(then)};
    return next_++;
  }

  absl::StatusOr<Request> StartParts(float* data, const std::vector<int64_t>& counts,
                                     const std::vector<int>& group, bool gather) {
    const std::string what =
        absl::StrFormat("%s of %d parts over ranks {%s}", gather ? "all-gather" : "reduce-scatter",
                        counts.size(), absl::StrJoin(group, ","));
    if (counts.size() != group.size()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": one part per member expected"));
    }
    if (group.size() <= 1) return Store({}, what);
    std::vector<int> count(counts.size()), displ(counts.size());
    int64_t at = 0;
    int member = -1;
    for (size_t k = 0; k < counts.size(); ++k) {
      if (counts[k] < 0 || counts[k] > std::numeric_limits<int>::max() ||
          at > std::numeric_limits<int>::max()) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": parts beyond MPI's int counts"));
      }
      count[k] = static_cast<int>(counts[k]);
      displ[k] = static_cast<int>(at);
      at += counts[k];
      if (group[k] == rank_) member = static_cast<int>(k);
    }
    if (member < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": not a member"));
    absl::StatusOr<MPI_Comm> comm = CommFor(group);
    if (!comm.ok()) return comm.status();
    MPI_Request r;
    if (gather) {
      MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, count.data(),
                                displ.data(), MPI_FLOAT, *comm, &r));
      return Store({r}, what);
    }
    MPI_CHECK(MPI_Ireduce_scatter(MPI_IN_PLACE, data, count.data(), MPI_FLOAT, MPI_SUM, *comm, &r));
    const int64_t own = counts[member], place = displ[member];
    return Store({r}, what,
                 [data, own, place] { std::memmove(data + place, data, own * sizeof(float)); });
  }

  absl::StatusOr<MPI_Comm> CommFor(const std::vector<int>& group) {
    if (auto it = comms_.find(group); it != comms_.end()) return it->second;
    MPI_Group world, sub;
    MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
    MPI_CHECK(MPI_Group_incl(world, static_cast<int>(group.size()), group.data(), &sub));
    MPI_Comm comm;
    // Collective over the group's members only, so each group is built by exactly its ranks.
    MPI_CHECK(MPI_Comm_create_group(MPI_COMM_WORLD, sub, /*tag=*/0, &comm));
    MPI_Group_free(&sub);
    MPI_Group_free(&world);
    comms_[group] = comm;
    return comm;
  }

  absl::StatusOr<Request> Start(void* data, int64_t n, MPI_Datatype type,
                                const std::vector<int>& group) {
    const std::string what =
        absl::StrFormat("sum of %d values over ranks {%s}", n, absl::StrJoin(group, ","));
    if (group.size() <= 1) return Store({}, what);
    absl::StatusOr<MPI_Comm> comm = CommFor(group);
    if (!comm.ok()) return comm.status();
    // Large buffers go in pieces: MPI counts are int.
    constexpr int64_t kPiece = int64_t{1} << 28;
    const int64_t elem = type == MPI_FLOAT ? 4 : 8;
    std::vector<MPI_Request> pieces;
    for (int64_t off = 0; off < n; off += kPiece) {
      const int count = static_cast<int>(std::min(kPiece, n - off));
      MPI_Request r;
      MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, static_cast<char*>(data) + off * elem, count, type,
                               MPI_SUM, *comm, &r));
      pieces.push_back(r);
    }
    return Store(std::move(pieces), what);
  }

  int rank_ = 0, size_ = 1;
  Request next_ = 0;
  std::map<Request, Pending> requests_;
  std::map<std::vector<int>, MPI_Comm> comms_;
};

}  // namespace

std::unique_ptr<Transport> MakeMpiTransport() { return std::make_unique<MpiTransport>(); }

}  // namespace freeride::pipeline
