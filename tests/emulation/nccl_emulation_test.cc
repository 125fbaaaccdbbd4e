// The emulation build's NCCL (models/cuda/emulation/nccl.cc), ranks as threads of this process:
// communicators from one id, grouped send/receive, sums (all-reduce, reduce-scatter, reduce)
// in rank order, all-gathers and broadcasts, stream order against events, the asynchronous
// error and abort; and pipeline/comm's NcclComm on top of it, bootstrapped over the in-process
// transport as the executor's tests run their ranks.
// Every rank thread runs in a CUDA context of its own (SetThreadContext), as each rank's process
// has: the device's synchronisation (cudaMemcpy, cudaFree) on one rank never waits for a peer's
// collective that waits for this rank.
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "models/cuda/emulation/runtime.h"
#include "pipeline/comm/nccl_comm.h"
#include "pipeline/comm/transport.h"

namespace freeride::emu {
namespace {

// Runs fn(rank) on `n` threads at once, each in context rank + 1, and joins them.
void RunRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&fn, r] {
      SetThreadContext(r + 1);
      fn(r);
    });
  }
  for (std::thread& t : threads) t.join();
}

std::vector<ncclComm_t> InitAll(int n) {
  ncclUniqueId id;
  EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<ncclComm_t> comms(n, nullptr);
  RunRanks(n, [&](int r) { EXPECT_EQ(ncclCommInitRank(&comms[r], n, id, r), ncclSuccess); });
  return comms;
}

template <typename T>
T* DeviceCopy(const std::vector<T>& host) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return static_cast<T*>(p);
}
template <typename T>
std::vector<T> HostCopy(const T* device, size_t n) {
  std::vector<T> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

ncclResult_t AsyncError(ncclComm_t comm) {
  ncclResult_t e = ncclInternalError;
  EXPECT_EQ(ncclCommGetAsyncError(comm, &e), ncclSuccess);
  return e;
}

TEST(NcclEmulationTest, RanksOfOneIdFormOneCommunicator) {
  std::vector<ncclComm_t> comms = InitAll(4);
  for (int r = 0; r < 4; ++r) {
    int count = 0, rank = -1;
    ASSERT_EQ(ncclCommCount(comms[r], &count), ncclSuccess);
    ASSERT_EQ(ncclCommUserRank(comms[r], &rank), ncclSuccess);
    EXPECT_EQ(count, 4);
    EXPECT_EQ(rank, r);
    EXPECT_EQ(AsyncError(comms[r]), ncclSuccess);
  }
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// A nonblocking initialisation (ncclConfig_t::blocking = 0: the transport's, so that its
// deadline holds) returns at once, ncclInProgress until every rank has joined; a rank that
// gives up first (aborts) makes the others' ncclRemoteError, blocking ones' too, not a hang.
TEST(NcclEmulationTest, ANonblockingInitIsInProgressUntilEveryRankHasJoined) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t first = nullptr, last = nullptr;
  ASSERT_EQ(ncclCommInitRankConfig(&first, 2, id, 0, &config), ncclInProgress);
  EXPECT_EQ(AsyncError(first), ncclInProgress);
  ASSERT_EQ(ncclCommInitRankConfig(&last, 2, id, 1, &config), ncclSuccess);
  EXPECT_EQ(AsyncError(first), ncclSuccess);
  EXPECT_EQ(AsyncError(last), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(first), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(last), ncclSuccess);

  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t quitter = nullptr, waiting = nullptr, late = nullptr;
  ASSERT_EQ(ncclCommInitRankConfig(&quitter, 3, id, 0, &config), ncclInProgress);
  ASSERT_EQ(ncclCommInitRankConfig(&waiting, 3, id, 1, &config), ncclInProgress);
  EXPECT_EQ(ncclCommAbort(quitter), ncclSuccess);  // its deadline passed
  EXPECT_EQ(AsyncError(waiting), ncclRemoteError);
  EXPECT_EQ(ncclCommInitRank(&late, 3, id, 2), ncclRemoteError);
  EXPECT_EQ(ncclCommAbort(waiting), ncclSuccess);
}

TEST(NcclEmulationTest, BadArgumentsAreRefusedAtTheCall) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument);
  ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  std::vector<float> host(8, 1.0f);
  float* device = DeviceCopy(host);
  // NCCL works on device memory only: a host buffer, a peer out of range, another operation.
  EXPECT_EQ(ncclSend(host.data(), 8, ncclFloat, 0, comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclSend(device, 8, ncclFloat, 1, comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(device, device, 8, ncclFloat, ncclMax, comm, nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);  // no group open
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  cudaFree(device);
}

// A ring: every rank sends its block to the next and receives the previous one's, in one group
// per rank (outside a group the sends would wait for receives never posted).
TEST(NcclEmulationTest, GroupedRingExchangeDeliversEachBlock) {
  const int n = 3;
  const size_t count = 1000;
  std::vector<ncclComm_t> comms = InitAll(n);
  RunRanks(n, [&](int r) {
    std::vector<float> mine(count);
    for (size_t i = 0; i < count; ++i) mine[i] = static_cast<float>(r * 10000 + i);
    float* send = DeviceCopy(mine);
    float* recv = DeviceCopy(std::vector<float>(count, -1.0f));
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclSend(send, count, ncclFloat, (r + 1) % n, comms[r], stream), ncclSuccess);
    ASSERT_EQ(ncclRecv(recv, count, ncclFloat, (r + n - 1) % n, comms[r], stream), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::vector<float> got = HostCopy(recv, count);
    const int from = (r + n - 1) % n;
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(got[i], static_cast<float>(from * 10000 + i));
    EXPECT_EQ(AsyncError(comms[r]), ncclSuccess);
    cudaStreamDestroy(stream);
    cudaFree(send);
    cudaFree(recv);
  });
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// Values whose sum depends on the order of the additions: every rank gets ((a0 + a1) + a2),
// the rank order the in-process transport's sums use, bit for bit, in place or not.
TEST(NcclEmulationTest, AllReduceSumsInRankOrderWithTheSameBitsEverywhere) {
  const int n = 3;
  const std::vector<float> a = {1e8f, -1e8f, 1.0f};
  const std::vector<double> d = {1e17, 1.0, -1e17};
  const float float_sum = (a[0] + a[1]) + a[2];
  const double double_sum = (d[0] + d[1]) + d[2];
  ASSERT_NE(float_sum, a[0] + (a[1] + a[2]));  // the order shows
  std::vector<ncclComm_t> comms = InitAll(n);
  RunRanks(n, [&](int r) {
    float* f = DeviceCopy(std::vector<float>(5, a[r]));
    double* in = DeviceCopy(std::vector<double>(2, d[r]));
    double* out = DeviceCopy(std::vector<double>(2, 0.0));
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(ncclAllReduce(f, f, 5, ncclFloat, ncclSum, comms[r], stream), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(in, out, 2, ncclDouble, ncclSum, comms[r], stream), ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    for (float v : HostCopy(f, 5)) EXPECT_EQ(v, float_sum);
    for (double v : HostCopy(out, 2)) EXPECT_EQ(v, double_sum);
    EXPECT_EQ(HostCopy(in, 2)[0], d[r]);  // out of place: the input stays
    cudaStreamDestroy(stream);
    cudaFree(f);
    cudaFree(in);
    cudaFree(out);
  });
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// ZeRO-1's two halves: a reduce-scatter gives rank r slice r of the rank-order sum, bit for bit
// (each slice's values show the order and its place: ((s + 1)·1e8 − (s + 1)·1e8) + (s + 1) is
// s + 1, the other association 0), in place or not; an all-gather gives every rank every
// rank's values in rank order, in place or not.
TEST(NcclEmulationTest, ReduceScatterSumsInRankOrderAndAllGatherConcatenatesInRankOrder) {
  const int n = 3;
  const std::vector<float> a = {1e8f, -1e8f, 1.0f};
  ASSERT_NE((a[0] + a[1]) + a[2], a[0] + (a[1] + a[2]));
  std::vector<ncclComm_t> comms = InitAll(n);
  RunRanks(n, [&](int r) {
    std::vector<float> contribution;
    std::vector<double> wide;
    for (int slice = 0; slice < n; ++slice) {
      for (int e = 0; e < 2; ++e) {
        contribution.push_back(a[r] * static_cast<float>(slice + 1));
        wide.push_back(static_cast<double>(a[r]) * 1e9 * (slice + 1));
      }
    }
    float* in_place = DeviceCopy(contribution);
    double* wide_in = DeviceCopy(wide);
    double* wide_out = DeviceCopy(std::vector<double>(2, 0.0));
    float* mine = DeviceCopy(std::vector<float>{10.0f * r, 10.0f * r + 1});
    float* gathered = DeviceCopy(std::vector<float>(2 * n, -1.0f));
    std::vector<float> places(n, -1.0f);  // one value each, rank r's at r
    places[r] = 100.0f + r;
    float* gathered_in_place = DeviceCopy(places);
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(
        ncclReduceScatter(in_place, in_place + 2 * r, 2, ncclFloat, ncclSum, comms[r], stream),
        ncclSuccess);
    ASSERT_EQ(ncclReduceScatter(wide_in, wide_out, 2, ncclDouble, ncclSum, comms[r], stream),
              ncclSuccess);
    ASSERT_EQ(ncclAllGather(mine, gathered, 2, ncclFloat, comms[r], stream), ncclSuccess);
    ASSERT_EQ(
        ncclAllGather(gathered_in_place + r, gathered_in_place, 1, ncclFloat, comms[r], stream),
        ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::vector<float> summed = HostCopy(in_place, 2 * n);
    EXPECT_EQ(summed[2 * r], static_cast<float>(r + 1));
    EXPECT_EQ(summed[2 * r + 1], static_cast<float>(r + 1));
    const double a0 = a[0] * 1e9 * (r + 1), a1 = a[1] * 1e9 * (r + 1), a2 = a[2] * 1e9 * (r + 1);
    for (double v : HostCopy(wide_out, 2)) EXPECT_EQ(v, (a0 + a1) + a2);
    EXPECT_EQ(HostCopy(gathered, 2 * n), (std::vector<float>{0, 1, 10, 11, 20, 21}));
    const std::vector<float> in_place_gathered = HostCopy(gathered_in_place, n);
    for (int q = 0; q < n; ++q) EXPECT_EQ(in_place_gathered[q], 100.0f + q);
    cudaStreamDestroy(stream);
    for (void* p :
         std::vector<void*>{in_place, wide_in, wide_out, mine, gathered, gathered_in_place}) {
      cudaFree(p);
    }
  });
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// ZeRO-1's unequal shares: a group of in-place reduces, one per share with its owner as root,
// leaves the rank-order sum (the all-reduce's bits) at each root and the other ranks' buffers
// untouched; a group of in-place broadcasts, root = each share's owner, gives every rank every
// owner's values.
TEST(NcclEmulationTest, ReducesSumToTheirRootInRankOrderAndBroadcastsCopyTheRoots) {
  const int n = 3;
  const std::vector<float> a = {1e8f, -1e8f, 1.0f};
  ASSERT_NE((a[0] + a[1]) + a[2], a[0] + (a[1] + a[2]));
  const std::vector<size_t> share_begin = {0, 1, 4, 6};  // unequal shares: 1, 3, 2 elements
  std::vector<ncclComm_t> comms = InitAll(n);
  RunRanks(n, [&](int r) {
    std::vector<float> grads(6), params(6, -1.0f);
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = a[r] * static_cast<float>(i + 1);
    for (size_t i = share_begin[r]; i < share_begin[r + 1]; ++i) params[i] = 10.0f * r + i;
    float* g = DeviceCopy(grads);
    float* p = DeviceCopy(params);
    double* wide = DeviceCopy(std::vector<double>{static_cast<double>(a[r]) * 1e9});
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int owner = 0; owner < n; ++owner) {
      float* share = g + share_begin[owner];
      const size_t count = share_begin[owner + 1] - share_begin[owner];
      ASSERT_EQ(ncclReduce(share, share, count, ncclFloat, ncclSum, owner, comms[r], stream),
                ncclSuccess);
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    ASSERT_EQ(ncclReduce(wide, wide, 1, ncclDouble, ncclSum, 2, comms[r], stream), ncclSuccess);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int owner = 0; owner < n; ++owner) {
      float* share = p + share_begin[owner];
      const size_t count = share_begin[owner + 1] - share_begin[owner];
      ASSERT_EQ(ncclBroadcast(share, share, count, ncclFloat, owner, comms[r], stream),
                ncclSuccess);
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::vector<float> summed = HostCopy(g, 6);
    for (size_t i = 0; i < summed.size(); ++i) {
      const float k = static_cast<float>(i + 1);
      const bool mine = i >= share_begin[r] && i < share_begin[r + 1];
      EXPECT_EQ(summed[i], mine ? (a[0] * k + a[1] * k) + a[2] * k : grads[i]) << "element " << i;
    }
    const double w0 = a[0] * 1e9, w1 = a[1] * 1e9, w2 = a[2] * 1e9;
    EXPECT_EQ(HostCopy(wide, 1)[0], r == 2 ? (w0 + w1) + w2 : static_cast<double>(a[r]) * 1e9);
    EXPECT_EQ(HostCopy(p, 6), (std::vector<float>{0, 11, 12, 13, 24, 25}));
    // A root outside the communicator is refused at the call.
    EXPECT_EQ(ncclBroadcast(p, p, 1, ncclFloat, n, comms[r], stream), ncclInvalidArgument);
    EXPECT_EQ(ncclReduce(g, g, 1, ncclFloat, ncclSum, -1, comms[r], stream), ncclInvalidArgument);
    cudaStreamDestroy(stream);
    for (void* q : std::vector<void*>{g, p, wide}) cudaFree(q);
  });
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// Stream order on a deliberately slow communication stream: the receive's event is not
// reached before the data has landed, and a compute stream that waits on it reads the received
// values. Without the wait, the compute stream's copy would read the buffer's old contents.
TEST(NcclEmulationTest, AReceivesEventOrdersTheComputeStreamThatReadsIt) {
  std::vector<ncclComm_t> comms = InitAll(2);
  SetNcclRankDelay(1, 0.05);
  const size_t count = 4096;
  std::atomic<bool> recorded{false};
  RunRanks(2, [&](int r) {
    cudaStream_t comm_stream, compute;
    ASSERT_EQ(cudaStreamCreateWithFlags(&comm_stream, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
    if (r == 0) {
      float* send = DeviceCopy(std::vector<float>(count, 7.0f));
      ASSERT_EQ(ncclSend(send, count, ncclFloat, 1, comms[0], comm_stream), ncclSuccess);
      ASSERT_EQ(cudaStreamSynchronize(comm_stream), cudaSuccess);
      cudaFree(send);
    } else {
      float* recv = DeviceCopy(std::vector<float>(count, -1.0f));
      float* copy = DeviceCopy(std::vector<float>(count, 0.0f));
      cudaEvent_t received;
      ASSERT_EQ(cudaEventCreateWithFlags(&received, cudaEventDisableTiming), cudaSuccess);
      ASSERT_EQ(ncclRecv(recv, count, ncclFloat, 0, comms[1], comm_stream), ncclSuccess);
      ASSERT_EQ(cudaEventRecord(received, comm_stream), cudaSuccess);
      recorded = true;
      ASSERT_EQ(cudaStreamWaitEvent(compute, received, 0), cudaSuccess);
      ASSERT_EQ(
          cudaMemcpyAsync(copy, recv, count * sizeof(float), cudaMemcpyDeviceToDevice, compute),
          cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
      EXPECT_EQ(cudaEventQuery(received), cudaSuccess);
      for (float v : HostCopy(copy, count)) ASSERT_EQ(v, 7.0f);
      cudaEventDestroy(received);
      cudaFree(recv);
      cudaFree(copy);
    }
    cudaStreamDestroy(comm_stream);
    cudaStreamDestroy(compute);
  });
  SetNcclRankDelay(1, 0);
  EXPECT_TRUE(recorded);
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// cudaFree synchronises the device, and a rank frees memory while its peer's sum already waits
// for this rank's contribution: on GPUs the peer's stream is another process's (another
// device's), which the free does not wait for. With both ranks in one context the free waited
// for the peer's sum and the sum for this rank, until the peer's deadline aborted it: how
// Trainer::Create's setup sum hung in CI (rank 0 freed its probe models while rank 1 summed).
TEST(NcclEmulationTest, AFreeOnOneRankDoesNotWaitForAPeersSumThatWaitsForIt) {
  std::vector<ncclComm_t> comms = InitAll(2);
  std::atomic<bool> peer_summing{false};
  std::vector<double> sums(2, 0.0);
  bool aborted[2] = {false, false};
  RunRanks(2, [&](int r) {
    double* value = DeviceCopy(std::vector<double>(1, 1.0 + r));
    cudaStream_t stream;
    cudaEvent_t summed;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaEventCreateWithFlags(&summed, cudaEventDisableTiming), cudaSuccess);
    if (r == 0) {
      while (!peer_summing) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      void* scratch = nullptr;
      ASSERT_EQ(cudaMalloc(&scratch, 64), cudaSuccess);
      ASSERT_EQ(cudaFree(scratch), cudaSuccess);
    }
    ASSERT_EQ(ncclAllReduce(value, value, 1, ncclDouble, ncclSum, comms[r], stream), ncclSuccess);
    ASSERT_EQ(cudaEventRecord(summed, stream), cudaSuccess);
    if (r == 1) peer_summing = true;  // its sum is on its stream, waiting for rank 0's part
    // A cap, not a timing: once both parts are in, the sum is done; one rank waiting for the
    // other's free would wait forever without it.
    const auto cap = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (cudaEventQuery(summed) != cudaSuccess && std::chrono::steady_clock::now() < cap) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (cudaEventQuery(summed) != cudaSuccess) {
      ADD_FAILURE() << "rank " << r << "'s sum did not complete within 30 s";
      EXPECT_EQ(ncclCommAbort(comms[r]), ncclSuccess);
      aborted[r] = true;
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    sums[r] = HostCopy(value, 1)[0];
    cudaEventDestroy(summed);
    cudaStreamDestroy(stream);
    cudaFree(value);
  });
  EXPECT_EQ(sums, (std::vector<double>{3.0, 3.0}));
  for (int r = 0; r < 2; ++r) {
    if (!aborted[r]) {
      EXPECT_EQ(ncclCommDestroy(comms[r]), ncclSuccess);
    }
  }
}

// Two ranks sending to each other outside a group wait for receives that come after the sends
// on the same stream: a deadlock, as NCCL's rendezvous makes it. Aborting both ends it.
TEST(NcclEmulationTest, UngroupedCrossedSendsDeadlockUntilAborted) {
  std::vector<ncclComm_t> comms = InitAll(2);
  std::vector<cudaStream_t> streams(2);
  std::vector<float*> buffers(2);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking), cudaSuccess);
    buffers[r] = DeviceCopy(std::vector<float>(16, 1.0f));
    ASSERT_EQ(ncclSend(buffers[r], 8, ncclFloat, 1 - r, comms[r], streams[r]), ncclSuccess);
    ASSERT_EQ(ncclRecv(buffers[r] + 8, 8, ncclFloat, 1 - r, comms[r], streams[r]), ncclSuccess);
  }
  // A deadlock stays one: however long this looks, the streams cannot have finished.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (int r = 0; r < 2; ++r) EXPECT_EQ(cudaStreamQuery(streams[r]), cudaErrorNotReady);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(ncclCommAbort(comms[r]), ncclSuccess);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
    cudaStreamDestroy(streams[r]);
    cudaFree(buffers[r]);
  }
}

// A peer that aborts (or is destroyed) ends the operations that need it, with ncclRemoteError
// as the survivor's asynchronous error; a receive of the wrong size is ncclInvalidUsage.
TEST(NcclEmulationTest, AnAbortedPeerIsARemoteErrorAndAMismatchInvalidUsage) {
  std::vector<ncclComm_t> comms = InitAll(2);
  float* buffer = DeviceCopy(std::vector<float>(8, 0.0f));
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(ncclRecv(buffer, 8, ncclFloat, 1, comms[0], stream), ncclSuccess);
  ASSERT_EQ(ncclCommAbort(comms[1]), ncclSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(AsyncError(comms[0]), ncclRemoteError);
  // After an error the communicator takes no more work.
  EXPECT_EQ(ncclRecv(buffer, 8, ncclFloat, 1, comms[0], stream), ncclInvalidUsage);
  EXPECT_EQ(ncclCommAbort(comms[0]), ncclSuccess);

  comms = InitAll(2);
  RunRanks(2, [&](int r) {
    float* mine = DeviceCopy(std::vector<float>(8, 1.0f));
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    if (r == 0) {
      ASSERT_EQ(ncclSend(mine, 8, ncclFloat, 1, comms[0], s), ncclSuccess);
    } else {
      ASSERT_EQ(ncclRecv(mine, 4, ncclFloat, 0, comms[1], s), ncclSuccess);
    }
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    if (r == 1) {
      EXPECT_EQ(AsyncError(comms[1]), ncclInvalidUsage);
    }
    cudaStreamDestroy(s);
    cudaFree(mine);
  });
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommAbort(c), ncclSuccess);
  cudaStreamDestroy(stream);
  cudaFree(buffer);
}

}  // namespace
}  // namespace freeride::emu

namespace freeride::pipeline {
namespace {

// NcclComm as the product uses it: the id bootstrapped over a transport (here the in-process
// one, ranks as threads), a grouped exchange with the other rank both ways, and a sum.
TEST(NcclCommEmulatedTest, BootstrapsOverATransportExchangesAndSums) {
  const int n = 2;
  const int64_t count = 512;
  std::vector<std::unique_ptr<Transport>> world = MakeInProcessWorld(n);
  emu::RunRanks(n, [&](int r) {
    auto comm = NcclComm::Create(*world[r], 0, 60.0);
    ASSERT_TRUE(comm.ok()) << comm.status();
    EXPECT_EQ((*comm)->rank(), r);
    EXPECT_EQ((*comm)->size(), n);
    float* send = emu::DeviceCopy(std::vector<float>(count, 1.0f + r));
    float* recv = emu::DeviceCopy(std::vector<float>(count, 0.0f));
    ASSERT_TRUE((*comm)->Exchange(send, count * 4, 1 - r, recv, count * 4, 1 - r, nullptr).ok());
    ASSERT_TRUE((*comm)->AllReduceSum(recv, count, nullptr).ok());
    ASSERT_TRUE((*comm)->Wait(60.0).ok());
    // Each rank received the other's value; the sum of 2 and 1 is 3 on both.
    for (float v : emu::HostCopy(recv, count)) ASSERT_EQ(v, 3.0f);
    cudaFree(send);
    cudaFree(recv);
  });
}

// A peer that never sends: the wait's deadline passes, the communicator is aborted and the
// error names the rank; the peer, sending later, fails with NCCL's remote error, not a hang.
TEST(NcclCommEmulatedTest, ALatePeerMissesTheDeadlineAndTheCommunicatorIsAborted) {
  std::vector<std::unique_ptr<Transport>> world = MakeInProcessWorld(2);
  std::atomic<bool> aborted{false};
  emu::RunRanks(2, [&](int r) {
    auto comm = NcclComm::Create(*world[r], 0, 60.0);
    ASSERT_TRUE(comm.ok()) << comm.status();
    float* buffer = emu::DeviceCopy(std::vector<float>(64, 0.0f));
    if (r == 0) {
      ASSERT_TRUE((*comm)->Exchange(nullptr, 0, -1, buffer, 256, 1, nullptr).ok());
      const absl::Status late = (*comm)->Wait(0.1);
      EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded) << late;
      EXPECT_NE(late.message().find("rank 0"), std::string::npos) << late;
      EXPECT_EQ((*comm)->Exchange(buffer, 256, 1, nullptr, 0, -1, nullptr).code(),
                absl::StatusCode::kFailedPrecondition);
      aborted = true;
    } else {
      while (!aborted) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ASSERT_TRUE((*comm)->Exchange(buffer, 256, 0, nullptr, 0, -1, nullptr).ok());
      const absl::Status lost = (*comm)->Wait(60.0);
      EXPECT_EQ(lost.code(), absl::StatusCode::kUnavailable) << lost;
      EXPECT_NE(lost.message().find("remote process exited"), std::string::npos) << lost;
    }
    cudaFree(buffer);
  });
}

// A rank that gives its part of the id's sum but never joins the communicator (it failed in
// between): Create fails at its deadline instead of waiting for it forever.
TEST(NcclCommEmulatedTest, ARankThatNeverJoinsFailsCreateByItsDeadline) {
  std::vector<std::unique_ptr<Transport>> world = MakeInProcessWorld(2);
  std::atomic<bool> id_given{false};
  emu::RunRanks(2, [&](int r) {
    if (r == 0) {
      // The id's sum within the short deadline, however late this thread runs: rank 1's part
      // is already there.
      while (!id_given) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      auto comm = NcclComm::Create(*world[0], 0, 0.2);
      ASSERT_FALSE(comm.ok());
      EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
      EXPECT_NE(comm.status().message().find(
                    "the initialisation of the NCCL communicator on rank 0 did not complete "
                    "within 0.2 s: a rank of the 2 never came (communicator aborted)"),
                std::string::npos)
          << comm.status();
    } else {
      std::vector<double> id(sizeof(ncclUniqueId), 0.0);
      auto sum = world[1]->StartAllReduceSum(id.data(), static_cast<int64_t>(id.size()),
                                             world[1]->AllRanks());
      id_given = true;
      ASSERT_TRUE(sum.ok()) << sum.status();
      EXPECT_TRUE(world[1]->Wait(*sum, 60).ok());
    }
  });
}

}  // namespace
}  // namespace freeride::pipeline
