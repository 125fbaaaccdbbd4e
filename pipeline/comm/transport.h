// How pipeline ranks talk: point-to-point activations and gradients, and sums over groups of
// ranks (tied embedding, data-parallel gradients, gradient norm, loss). One interface, several
// implementations: MPI between processes (mpi_transport.cc), threads in one process for tests
// (in_process_transport.cc). Every wait has a timeout, so a lost peer is an error, never a hang.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/clock.h"
#include "models/stage_message.h"

namespace freeride::pipeline {

class Transport {
 public:
  using Request = int64_t;

  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank, ascending: the group of a world-wide sum.
  std::vector<int> AllRanks() const {
    std::vector<int> all(size());
    for (int r = 0; r < size(); ++r) all[r] = r;
    return all;
  }

  // Non-blocking send / receive of `bytes` to / from global rank `peer`; `tag` tells the
  // messages of one peer apart (matched in order per (peer, tag)). The buffer must stay
  // untouched until Wait returns.
  virtual absl::StatusOr<Request> Isend(const void* data, int64_t bytes, int peer, int tag) = 0;
  virtual absl::StatusOr<Request> Irecv(void* data, int64_t bytes, int peer, int tag) = 0;
  // Isend of a buffer the device may still be writing: the send starts once `written` (a
  // cudaEvent_t recorded after the writes; null: the buffer is complete) has completed,
  // ordered on the device, without the host waiting for it. Transports that take host memory
  // only take complete buffers.
  virtual absl::StatusOr<Request> IsendAfter(const void* data, int64_t bytes, int peer, int tag,
                                             void* written) {
    if (written != nullptr) {
      return absl::FailedPreconditionError("this transport sends complete host buffers only");
    }
    return Isend(data, bytes, peer, tag);
  }
  // Whether a message's buffer may be device memory, carried as it is (NCCL's): the stage
  // executor then has its chunks allocate their messages on their device, and no message
  // leaves the GPU. The others take host memory only.
  virtual bool CarriesDeviceMemory() const { return false; }
  // Blocks until the request completes; DeadlineExceeded after `timeout_s`.
  virtual absl::Status Wait(Request request, double timeout_s) = 0;
  // True when the request has completed (Wait then returns at once); never blocks.
  virtual bool Test(Request request) = 0;

  // In-place elementwise sum over `group` (global ranks, ascending; this rank among them),
  // DeadlineExceeded after `timeout_s`. Every member gets the same bits.
  virtual absl::Status AllReduceSum(float* data, int64_t n, const std::vector<int>& group,
                                    double timeout_s) = 0;
  virtual absl::Status AllReduceSum(double* data, int64_t n, const std::vector<int>& group,
                                    double timeout_s) = 0;
  // The same sum, started without waiting for it: `data` holds the result once Wait on the
  // request returns (Test says when it would return at once) and must stay untouched until
  // then. The members of a group start its sums, blocking or not, in the same order.
  virtual absl::StatusOr<Request> StartAllReduceSum(float* data, int64_t n,
                                                    const std::vector<int>& group) = 0;
  virtual absl::StatusOr<Request> StartAllReduceSum(double* data, int64_t n,
                                                    const std::vector<int>& group) = 0;
  // Sums of device memory, for a transport that carries it (CarriesDeviceMemory): each of
  // `ranges` (floats, device memory) summed in place over `group`, all in one request, once
  // `ready` (a cudaEvent_t recorded on the stream that wrote them; null: none) has completed:
  // ordered on the device, the host does not wait for it. Completes as a started sum does
  // (Wait, Test). Others refuse.
  struct DeviceRange {
    void* data = nullptr;
    int64_t n = 0;      // elements
    bool bf16 = false;  // else fp32; a broadcast's only (ZeRO-1's bf16 weights): sums are fp32
  };
  virtual absl::StatusOr<Request> StartDeviceSum(const std::vector<DeviceRange>& /*ranges*/,
                                                 const std::vector<int>& /*group*/,
                                                 void* /*ready*/) {
    return absl::UnimplementedError("this transport sums host memory only");
  }
  // ZeRO-1's two halves on device memory (parallel.zero = 1 over NCCL), ordered as
  // StartDeviceSum is: range i belongs to group member roots[i] (its place in `group`). A
  // reduce sums each range in place over the group into its owner's (adding as AllReduceSum
  // adds; the other members' values there are left as they were), a broadcast copies each
  // range from its owner to every member, in place. One request for all of them.
  enum class DeviceRooted { kReduce, kBroadcast };
  virtual absl::StatusOr<Request> StartDeviceRooted(DeviceRooted /*kind*/,
                                                    const std::vector<DeviceRange>& /*ranges*/,
                                                    const std::vector<int>& /*roots*/,
                                                    const std::vector<int>& /*group*/,
                                                    void* /*ready*/) {
    return absl::UnimplementedError("this transport moves host memory only");
  }
  // ZeRO-1's two halves of a sum (parallel.zero = 1): `counts[k]` values belong to group
  // member k, back to back in member order (n = Σ counts in `data` on every member). The
  // reduce-scatter sums `data` over the group elementwise, adding as AllReduceSum adds, and
  // leaves in each member's data the sum of its own part, at that part's place (the rest of
  // `data` is then undefined). The all-gather copies each member's part of its `data` to the
  // same place in every member's. Both complete as a started sum does (Wait, Test). The
  // defaults: the reduce-scatter as a whole sum; the all-gather only for a group of one.
  virtual absl::StatusOr<Request> StartReduceScatterSum(float* data,
                                                        const std::vector<int64_t>& counts,
                                                        const std::vector<int>& group) {
    int64_t n = 0;
    for (int64_t c : counts) n += c;
    return StartAllReduceSum(data, n, group);
  }
  virtual absl::StatusOr<Request> StartAllGather(float* data, const std::vector<int64_t>& counts,
                                                 const std::vector<int>& group) {
    if (group.size() > 1) {
      return absl::UnimplementedError("this transport has no all-gather (parallel.zero = 1)");
    }
    return StartAllReduceSum(data, counts.empty() ? 0 : counts[0], group);
  }
  // A training step begins (on the stage executor's clock); transports that keep time per
  // step use it.
  virtual void OnStepStart(double /*now_s*/) {}
  // The run is over, on every rank (collective), maybe with operations still in flight (the
  // receives a post-validated step posted ahead, a failed step's): a transport whose pending
  // operations hold the device (NCCL's, which freeing device memory would wait for forever)
  // ends them, and is then unusable. Others need nothing.
  virtual void AbortInFlight() {}
};

// A world of one rank: sums are the identity; point-to-point is an error (nothing to talk to).
std::unique_ptr<Transport> MakeSelfTransport();

// MPI_COMM_WORLD (MPI must be initialised, with at least MPI_THREAD_FUNNELED).
std::unique_ptr<Transport> MakeMpiTransport();

struct Schedule;
struct CostModel;

// One real stage of a p-stage pipeline; the other stages are emulated (one process, dp = 1;
// interleaved schedules too: message tags name virtual stages). Messages to the real stage arrive
// when the simulator, run with `cost`, says they would, shifted by how late the real stage's own
// earlier sends were against their simulated times (so a slow real stage sees its gradients come
// back late); their contents are synthetic, values of `message_type` (the real stage's chunks').
// Sums with emulated members complete when the last of them would arrive and add nothing to the
// real stage's values. Times are on `clock` (the stage executor's; null: the system clock).
// See docs/emulation.md.
absl::StatusOr<std::unique_ptr<Transport>> MakeEmulatedPeersTransport(const Schedule& schedule,
                                                                      const CostModel& cost,
                                                                      int real_stage,
                                                                      MessageType message_type,
                                                                      Clock* clock = nullptr);

// `size` ranks as threads of this process: MakeInProcessWorld returns one Transport per rank,
// each to be used by one thread. Sums add contributions in rank order.
std::vector<std::unique_ptr<Transport>> MakeInProcessWorld(int size);

}  // namespace freeride::pipeline
