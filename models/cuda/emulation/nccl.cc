// NCCL of the emulation build between the threads of one process: a communicator is a rank of
// a clique that every rank joins with the same unique id; its operations run on the emulated
// streams (streams.cc), in stream order, so an event recorded after one completes after it and
// an operation waits for the stream work enqueued before it.
//
// A group (ncclGroupStart/End, or one call outside a group) is one stream operation: it posts
// its sends and its all-reduce contributions, then completes its receives in issue order, the
// sums, and last waits until each of its sends has been received. A send so returns only once
// its receive has matched it, as NCCL's rendezvous protocol does for large messages: two ranks
// sending to each other outside one group deadlock here too, instead of passing by luck.
// Receives match sends in order per (sender, receiver); all-reduces match in issue order.
// Sums add the ranks' contributions in rank order, so every rank gets the same bits (those of
// the in-process transport's sums, pipeline/comm/in_process_transport.cc). Reduce-scatters and
// all-gathers, reduces and broadcasts (ZeRO-1's) are collectives in the same issue order: a
// reduce-scatter gives each rank its slice of that rank-order sum, an all-gather every rank's
// values in rank order, a reduce the rank-order sum to its root only, a broadcast the root's
// values to every rank. The calls themselves, with their checks, are in nccl_calls.cc.
//
// ncclCommAbort ends this rank's operations where they stand (buffers left as they are); a
// peer's operation that needs an aborted or destroyed rank ends too, with ncclRemoteError as
// the peer's asynchronous error, so that a lost peer surfaces as an error, never a hang. So
// does a communicator's initialisation that a rank of it gave up before all had joined; a
// nonblocking one (ncclConfig_t::blocking = 0) is ncclInProgress until they have, which lets
// the caller give up at its deadline instead of waiting for a rank that never comes.
#include "models/cuda/emulation/include/nccl.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "models/cuda/emulation/nccl_internal.h"
#include "models/cuda/emulation/runtime.h"

namespace freeride::emu {

size_t TypeBytes(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
  }
  return 0;
}

namespace {

struct Message {
  const void* data = nullptr;
  size_t bytes = 0;
  bool taken = false;
};

struct Collective {
  explicit Collective(int nranks) : contributions(nranks) {}
  size_t count = 0;
  ncclDataType_t type = ncclFloat;
  std::vector<std::vector<char>> contributions;
  int deposited = 0, read = 0;
  int kind = -1;  // its Op::Kind
  int root = -1;  // a reduce's or broadcast's
};

struct Clique {
  explicit Clique(int n)
      : nranks(n), joined(n, false), gone(n, false), channels(static_cast<size_t>(n) * n) {}
  const int nranks;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<bool> joined;
  std::vector<bool> gone;  // aborted or destroyed: its operations will not come
  std::vector<std::deque<std::shared_ptr<Message>>> channels;   // [sender · n + receiver]
  std::map<uint64_t, std::shared_ptr<Collective>> collectives;  // by issue number
  // Under mu.
  bool Complete() const {
    for (bool j : joined) {
      if (!j) return false;
    }
    return true;
  }
  bool AnyGone() const {
    for (bool g : gone) {
      if (g) return true;
    }
    return false;
  }
};

}  // namespace

// What a rank's stream operations share with the handle: they outlive an aborted handle.
struct CommState {
  std::shared_ptr<Clique> clique;
  int rank = 0;
  std::atomic<int> async_error{ncclSuccess};
  uint64_t next_collective = 0;  // issue order, on the host
  void Fail(ncclResult_t error) {
    int expected = ncclSuccess;
    async_error.compare_exchange_strong(expected, error);
  }
};

struct NcclComm {
  std::shared_ptr<CommState> state;
};

namespace {

std::mutex registry_mu;
std::map<std::string, std::shared_ptr<Clique>>& Registry() {
  static auto* cliques = new std::map<std::string, std::shared_ptr<Clique>>;
  return *cliques;
}

std::mutex delay_mu;
std::map<int, double>& Delays() {
  static auto* delays = new std::map<int, double>;
  return *delays;
}
double DelayOf(int rank) {
  std::lock_guard<std::mutex> lock(delay_mu);
  auto it = Delays().find(rank);
  return it == Delays().end() ? 0.0 : it->second;
}

double rooted_delay = 0;  // under delay_mu

// A group's delay on its stream: its rank's, and a reduce's or broadcast's
// (SetNcclRootedDelay).
double GroupDelay(int rank, const std::vector<Op>& ops) {
  double delay = DelayOf(rank);
  std::lock_guard<std::mutex> lock(delay_mu);
  for (const Op& op : ops) {
    if (op.kind == Op::kReduce || op.kind == Op::kBroadcast) return delay + rooted_delay;
  }
  return delay;
}

template <typename T>
void SumInRankOrder(const Collective& c, void* out) {
  T* dst = static_cast<T*>(out);
  for (size_t i = 0; i < c.count; ++i) {
    T sum = reinterpret_cast<const T*>(c.contributions[0].data())[i];
    for (size_t r = 1; r < c.contributions.size(); ++r) {
      sum += reinterpret_cast<const T*>(c.contributions[r].data())[i];
    }
    dst[i] = sum;
  }
}

// A reduce-scatter's or all-gather's result for rank `me` of `n`: its slice of the rank-order
// sum (n equal slices in rank order), or every rank's contribution in rank order.
void FinishScatterOrGather(const Collective& c, int me, int n, void* out) {
  const size_t bytes = c.contributions[0].size();
  if (c.kind == Op::kAllGather) {
    for (int r = 0; r < n; ++r) {
      std::memcpy(static_cast<char*>(out) + r * bytes, c.contributions[r].data(), bytes);
    }
    return;
  }
  const size_t slice = c.count / n, type_bytes = TypeBytes(c.type);
  auto sum_slice = [&](auto zero) {
    using T = decltype(zero);
    T* dst = static_cast<T*>(out);
    for (size_t i = slice * me; i < slice * (me + 1); ++i) {
      T sum = reinterpret_cast<const T*>(c.contributions[0].data())[i];
      for (int r = 1; r < n; ++r) sum += reinterpret_cast<const T*>(c.contributions[r].data())[i];
      dst[i - slice * me] = sum;
    }
  };
  if (type_bytes == sizeof(float)) {
    sum_slice(0.0f);
  } else {
    sum_slice(0.0);
  }
}

// A collective's result for rank `me` of `n`, once every rank has deposited: an all-reduce's
// and the root's of a reduce the rank-order sum (a reduce leaves the others' buffers as they
// are, as NCCL's recvbuff is the root's only), a broadcast every rank's the root's bytes.
void FinishCollective(const Collective& c, int me, int n, void* out) {
  if (c.kind == Op::kReduceScatter || c.kind == Op::kAllGather) {
    FinishScatterOrGather(c, me, n, out);
  } else if (c.kind == Op::kBroadcast) {
    const std::vector<char>& root = c.contributions[c.root];
    std::memcpy(out, root.data(), root.size());
  } else if (c.kind == Op::kAllReduce || me == c.root) {
    if (c.type == ncclFloat) {
      SumInRankOrder<float>(c, out);
    } else {
      SumInRankOrder<double>(c, out);
    }
  }
}

// Waits on the clique until `ready` holds; false (the operation ends) when this rank is gone,
// or when it is not ready and `peer_gone` says a rank it needs will never come: that is this
// rank's asynchronous ncclRemoteError.
template <typename Ready, typename PeerGone>
bool Await(CommState& s, std::unique_lock<std::mutex>& lock, Ready ready, PeerGone peer_gone) {
  Clique& c = *s.clique;
  c.cv.wait(lock, [&] { return ready() || c.gone[s.rank] || peer_gone(); });
  if (ready()) return true;
  if (!c.gone[s.rank]) s.Fail(ncclRemoteError);
  return false;
}

// One group's operations, on the stream's thread.
void RunGroup(const std::shared_ptr<CommState>& state, const std::vector<Op>& ops) {
  if (const double delay = GroupDelay(state->rank, ops); delay > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(delay));
  }
  CommState& s = *state;
  Clique& c = *s.clique;
  const int n = c.nranks, me = s.rank;
  std::unique_lock<std::mutex> lock(c.mu);
  if (c.gone[me] || s.async_error.load() != ncclSuccess) return;
  std::vector<std::shared_ptr<Message>> sent;
  for (const Op& op : ops) {
    if (op.kind == Op::kSend) {
      auto m = std::make_shared<Message>();
      m->data = op.send;
      m->bytes = op.bytes;
      c.channels[static_cast<size_t>(me) * n + op.peer].push_back(m);
      sent.push_back(m);
    } else if (op.kind != Op::kRecv) {
      std::shared_ptr<Collective>& coll = c.collectives[op.collective];
      if (coll == nullptr) {
        coll = std::make_shared<Collective>(n);
        coll->count = op.count;
        coll->type = op.type;
        coll->kind = op.kind;
        coll->root = op.peer;
      } else if (coll->kind != op.kind || coll->count != op.count || coll->type != op.type ||
                 coll->root != op.peer) {
        s.Fail(ncclInvalidUsage);  // ranks disagree on the collective: NCCL's would be garbage
      }
      // A broadcast reads only its root's buffer.
      if (op.kind != Op::kBroadcast || op.peer == me) {
        const char* src = static_cast<const char*>(op.send);
        coll->contributions[me].assign(src, src + op.bytes);
      }
      ++coll->deposited;
    }
  }
  c.cv.notify_all();
  for (const Op& op : ops) {
    if (op.kind == Op::kRecv) {
      auto& channel = c.channels[static_cast<size_t>(op.peer) * n + me];
      if (!Await(
              s, lock, [&] { return !channel.empty(); }, [&] { return c.gone[op.peer]; })) {
        return;
      }
      std::shared_ptr<Message> m = channel.front();
      channel.pop_front();
      if (m->bytes != op.bytes) {
        s.Fail(ncclInvalidUsage);  // NCCL requires the same count and type at both ends
      } else {
        std::memcpy(op.recv, m->data, op.bytes);
      }
      m->taken = true;
      c.cv.notify_all();
    }
  }
  for (const Op& op : ops) {
    if (op.kind == Op::kSend || op.kind == Op::kRecv) continue;
    std::shared_ptr<Collective> coll = c.collectives[op.collective];
    if (!Await(
            s, lock, [&] { return coll->deposited == n; }, [&] { return c.AnyGone(); }))
      return;
    FinishCollective(*coll, me, n, op.recv);
    if (++coll->read == n) c.collectives.erase(op.collective);
  }
  for (size_t i = 0, k = 0; i < ops.size(); ++i) {
    if (ops[i].kind != Op::kSend) continue;
    const std::shared_ptr<Message>& m = sent[k++];
    if (!Await(
            s, lock, [&] { return m->taken; }, [&] { return c.gone[ops[i].peer]; }))
      return;
  }
}

thread_local int group_depth = 0;
thread_local std::vector<std::pair<ncclComm_t, cudaStream_t>> group_keys;
thread_local std::vector<std::vector<Op>> group_ops;

void Submit(ncclComm_t comm, cudaStream_t stream, std::vector<Op> ops) {
  std::shared_ptr<CommState> state = comm->state;
  Enqueue(stream, [state, ops = std::move(ops)] { RunGroup(state, ops); });
}

}  // namespace

ncclResult_t Issue(ncclComm_t comm, cudaStream_t stream, Op op) {
  if (group_depth == 0) {
    Submit(comm, stream, {op});
    return ncclSuccess;
  }
  for (size_t i = 0; i < group_keys.size(); ++i) {
    if (group_keys[i] == std::make_pair(comm, stream)) {
      group_ops[i].push_back(op);
      return ncclSuccess;
    }
  }
  group_keys.emplace_back(comm, stream);
  group_ops.push_back({op});
  return ncclSuccess;
}

ncclResult_t CheckCall(ncclComm_t comm, cudaStream_t stream, int peer, const void* buffer,
                       size_t bytes) {
  if (comm == nullptr || !ValidStream(stream)) return ncclInvalidArgument;
  if (peer < -1 || peer >= comm->state->clique->nranks) return ncclInvalidArgument;
  if (bytes > 0 && !IsDeviceMemory(buffer, bytes)) return ncclInvalidArgument;
  if (comm->state->async_error.load() != ncclSuccess) return ncclInvalidUsage;
  return ncclSuccess;
}

int RanksOf(ncclComm_t comm) { return comm->state->clique->nranks; }

uint64_t NextCollective(ncclComm_t comm) { return comm->state->next_collective++; }

namespace {

void Leave(ncclComm_t comm) {
  Clique& c = *comm->state->clique;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    c.gone[comm->state->rank] = true;
  }
  c.cv.notify_all();
}

}  // namespace

void SetNcclRankDelay(int rank, double seconds) {
  std::lock_guard<std::mutex> lock(delay_mu);
  if (seconds > 0) {
    Delays()[rank] = seconds;
  } else {
    Delays().erase(rank);
  }
}

void SetNcclRootedDelay(double seconds) {
  std::lock_guard<std::mutex> lock(delay_mu);
  rooted_delay = seconds;
}

}  // namespace freeride::emu

ncclResult_t ncclGetVersion(int* version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    case ncclNumResults:
      break;
  }
  return "unknown result code";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t seed = std::random_device{}();
  std::memset(unique_id->internal, 0, sizeof(unique_id->internal));
  const uint64_t parts[2] = {seed, ++counter};
  std::memcpy(unique_id->internal, parts, sizeof(parts));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  return ncclCommInitRankConfig(comm, nranks, comm_id, rank, &config);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank,
                                    ncclConfig_t* config) {
  if (comm == nullptr || config == nullptr || nranks < 1 || rank < 0 || rank >= nranks) {
    return ncclInvalidArgument;
  }
  const std::string key(comm_id.internal, sizeof(comm_id.internal));
  std::shared_ptr<freeride::emu::Clique> clique;
  std::unique_lock<std::mutex> registry_lock(freeride::emu::registry_mu);
  std::shared_ptr<freeride::emu::Clique>& entry = freeride::emu::Registry()[key];
  if (entry == nullptr) entry = std::make_shared<freeride::emu::Clique>(nranks);
  clique = entry;
  std::unique_lock<std::mutex> lock(clique->mu);
  if (clique->nranks != nranks || clique->joined[rank]) return ncclInvalidUsage;
  clique->joined[rank] = true;
  // An id makes one communicator: the last rank in retires it.
  if (clique->Complete()) freeride::emu::Registry().erase(key);
  registry_lock.unlock();
  clique->cv.notify_all();
  auto state = std::make_shared<freeride::emu::CommState>();
  state->clique = clique;
  state->rank = rank;
  if (config->blocking == 0) {
    // Nonblocking: the caller polls ncclCommGetAsyncError until the others have joined.
    if (clique->AnyGone()) {
      state->async_error = ncclRemoteError;
    } else if (!clique->Complete()) {
      state->async_error = ncclInProgress;
    }
    *comm = new freeride::emu::NcclComm{state};
    return static_cast<ncclResult_t>(state->async_error.load());
  }
  clique->cv.wait(lock, [&] { return clique->Complete() || clique->AnyGone(); });
  if (clique->AnyGone()) return ncclRemoteError;  // a rank gave up before all were in
  *comm = new freeride::emu::NcclComm{state};
  return ncclSuccess;
}

// Leaves the clique once the stream work already enqueued has been given the chance to finish:
// the caller synchronises its streams first, as with NCCL.
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  freeride::emu::Leave(comm);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  freeride::emu::Leave(comm);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (comm == nullptr || async_error == nullptr) return ncclInvalidArgument;
  freeride::emu::CommState& s = *comm->state;
  if (s.async_error.load() == ncclInProgress) {
    // A nonblocking initialisation: done once every rank has joined; a rank that gave up
    // first (aborted) makes it fail.
    std::lock_guard<std::mutex> lock(s.clique->mu);
    if (s.clique->AnyGone()) {
      s.async_error = ncclRemoteError;
    } else if (s.clique->Complete()) {
      s.async_error = ncclSuccess;
    }
  }
  *async_error = static_cast<ncclResult_t>(s.async_error.load());
  return ncclSuccess;
}

ncclResult_t ncclCommCount(ncclComm_t comm, int* count) {
  if (comm == nullptr) return ncclInvalidArgument;
  *count = comm->state->clique->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank) {
  if (comm == nullptr) return ncclInvalidArgument;
  *rank = comm->state->rank;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++freeride::emu::group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (freeride::emu::group_depth == 0) return ncclInvalidUsage;
  if (--freeride::emu::group_depth > 0) return ncclSuccess;
  for (size_t i = 0; i < freeride::emu::group_keys.size(); ++i) {
    freeride::emu::Submit(freeride::emu::group_keys[i].first, freeride::emu::group_keys[i].second,
                          std::move(freeride::emu::group_ops[i]));
  }
  freeride::emu::group_keys.clear();
  freeride::emu::group_ops.clear();
  return ncclSuccess;
}
