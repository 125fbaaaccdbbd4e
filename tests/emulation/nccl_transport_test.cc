// The Transport over NCCL (pipeline/comm/nccl_transport.h) in the emulation build: ranks as
// threads, bootstrapped over the in-process transport. Messages in device, pinned and pageable
// memory, to neighbours and to the rank itself; sums with the in-process transport's bits; the
// bootstrap used for nothing after creation; a late peer failing the wait by its deadline.
#include "pipeline/comm/nccl_transport.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "models/cuda/emulation/runtime.h"
#include "pipeline/comm/transport.h"
#include "pipeline/generators.h"
#include "pipeline/schedule.h"

namespace freeride::pipeline {
namespace {

// Runs fn(rank) on `n` threads at once, each in a CUDA context of its own as each rank's
// process has (emu::SetThreadContext), and joins them.
void RunRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&fn, r] {
      emu::SetThreadContext(r + 1);
      fn(r);
    });
  }
  for (std::thread& t : threads) t.join();
}

// Counts the calls made to the transport it wraps, so that a test can say none came.
class CountingTransport : public Transport {
 public:
  explicit CountingTransport(Transport& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  absl::StatusOr<Request> Isend(const void* d, int64_t b, int p, int t) override {
    ++calls;
    return inner_.Isend(d, b, p, t);
  }
  absl::StatusOr<Request> Irecv(void* d, int64_t b, int p, int t) override {
    ++calls;
    return inner_.Irecv(d, b, p, t);
  }
  absl::Status Wait(Request r, double s) override {
    ++calls;
    return inner_.Wait(r, s);
  }
  bool Test(Request r) override {
    ++calls;
    return inner_.Test(r);
  }
  absl::Status AllReduceSum(float* d, int64_t n, const std::vector<int>& g, double s) override {
    ++calls;
    return inner_.AllReduceSum(d, n, g, s);
  }
  absl::Status AllReduceSum(double* d, int64_t n, const std::vector<int>& g, double s) override {
    ++calls;
    return inner_.AllReduceSum(d, n, g, s);
  }
  absl::StatusOr<Request> StartAllReduceSum(float* d, int64_t n,
                                            const std::vector<int>& g) override {
    ++calls;
    return inner_.StartAllReduceSum(d, n, g);
  }
  absl::StatusOr<Request> StartAllReduceSum(double* d, int64_t n,
                                            const std::vector<int>& g) override {
    ++calls;
    return inner_.StartAllReduceSum(d, n, g);
  }
  std::atomic<int64_t> calls{0};

 private:
  Transport& inner_;
};

// Every neighbour pair of a chain of `n` ranks, both ways, one channel (tags below 100); sums
// over every rank and over the ends.
NcclTransportOptions Chain(int n) {
  NcclTransportOptions o;
  o.timeout_s = 60;
  o.tags_per_channel = 100;
  std::vector<int> all;
  for (int r = 0; r < n; ++r) {
    all.push_back(r);
    if (r + 1 < n) {
      o.links.push_back({r, r + 1, 0});
      o.links.push_back({r + 1, r, 0});
    }
  }
  o.groups = {all, {0, n - 1}};
  return o;
}

// Interleaved over 2 stages (virtual stages 0-3; stage 0 holds 0 and 2): the link from stage 0
// to stage 1 carries virtual stage 0's activations, 2's activations and 2's gradients, each
// on a channel of its own, so that none waits behind another's receives; replicas repeat it.
TEST(NcclTransportTest, PipelineOptionsGiveEachVirtualStageAndKindItsOwnLink) {
  ScheduleOptions so;
  so.kind = ScheduleKind::kInterleaved;
  so.stages = 2;
  so.microbatches = 4;
  so.chunks = 2;
  so.data_parallel = true;
  absl::StatusOr<Schedule> schedule = BuildSchedule(so);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  const NcclTransportOptions o = PipelineNcclOptions(*schedule, 2);
  EXPECT_EQ(o.tags_per_channel, 4);
  const int v = 4;  // a gradient's channel is v + its sender's virtual stage
  for (int d = 0; d < 2; ++d) {
    const int s0 = 2 * d, s1 = 2 * d + 1;
    for (const NcclLink& link : std::vector<NcclLink>{{s0, s1, 0},
                                                      {s0, s1, 2},
                                                      {s0, s1, v + 2},
                                                      {s1, s0, 1},
                                                      {s1, s0, v + 1},
                                                      {s1, s0, v + 3}}) {
      EXPECT_NE(std::find(o.links.begin(), o.links.end(), link), o.links.end())
          << link.sender << " -> " << link.receiver << " channel " << link.channel;
    }
  }
  EXPECT_EQ(o.links.size(), 12u);
  for (const std::vector<int>& g :
       std::vector<std::vector<int>>{{0, 1, 2, 3}, {0, 1}, {2, 3}, {0, 2}, {1, 3}}) {
    EXPECT_NE(std::find(o.groups.begin(), o.groups.end(), g), o.groups.end());
  }
}

// A three-stage chain: activations forward, gradients back, in device, pinned and pageable
// memory; one message to the rank itself (a V schedule's turn); then sums whose bits are the
// in-process transport's (contributions added in rank order), blocking and started.
TEST(NcclTransportTest, MessagesAndSumsMatchTheInProcessTransport) {
  const int n = 3;
  const int64_t count = 300;
  std::vector<std::unique_ptr<Transport>> world = MakeInProcessWorld(n);
  std::vector<std::unique_ptr<Transport>> reference = MakeInProcessWorld(n);
  std::vector<std::unique_ptr<CountingTransport>> counted(n);
  for (int r = 0; r < n; ++r) counted[r] = std::make_unique<CountingTransport>(*world[r]);
  RunRanks(n, [&](int r) {
    auto made = MakeNcclTransport(*counted[r], Chain(n));
    ASSERT_TRUE(made.ok()) << made.status();
    Transport& t = **made;
    const int64_t after_creation = counted[r]->calls;
    EXPECT_EQ(t.rank(), r);
    // Pinned for the activation, device memory for the gradient, pageable for the self copy.
    float *act_out, *act_in, *grad_out, *grad_in;
    ASSERT_EQ(cudaMallocHost(&act_out, count * 4), cudaSuccess);
    ASSERT_EQ(cudaMallocHost(&act_in, count * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&grad_out, count * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&grad_in, count * 4), cudaSuccess);
    std::vector<float> self_out(count, 0.5f * r), self_in(count, -1.0f);
    for (int64_t i = 0; i < count; ++i) act_out[i] = static_cast<float>(r * 1000 + i);
    std::vector<float> grads(count, 10.0f + r);
    ASSERT_EQ(cudaMemcpy(grad_out, grads.data(), count * 4, cudaMemcpyHostToDevice), cudaSuccess);
    std::vector<Transport::Request> requests;
    auto keep = [&](absl::StatusOr<Transport::Request> q) {
      ASSERT_TRUE(q.ok()) << q.status();
      requests.push_back(*q);
    };
    if (r > 0) keep(t.Irecv(act_in, count * 4, r - 1, 1));
    if (r < n - 1) keep(t.Irecv(grad_in, count * 4, r + 1, 2));
    keep(t.Irecv(self_in.data(), count * 4, r, 3));
    if (r < n - 1) keep(t.Isend(act_out, count * 4, r + 1, 1));
    if (r > 0) keep(t.Isend(grad_out, count * 4, r - 1, 2));
    keep(t.Isend(self_out.data(), count * 4, r, 3));
    for (Transport::Request q : requests) ASSERT_TRUE(t.Wait(q, 60).ok());
    if (r > 0) {
      for (int64_t i = 0; i < count; ++i) ASSERT_EQ(act_in[i], (r - 1) * 1000 + i);
    }
    if (r < n - 1) {
      std::vector<float> back(count);
      ASSERT_EQ(cudaMemcpy(back.data(), grad_in, count * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      for (float v : back) ASSERT_EQ(v, 11.0f + r);
    }
    EXPECT_EQ(self_in, self_out);

    // Values whose sum depends on its order: the NCCL sums equal the in-process ones bit for
    // bit, over every rank and over a pair.
    const float values[3] = {1e8f, -1e8f, 1.0f};
    std::vector<float> over_all(5, values[r]), expected_all(5, values[r]);
    ASSERT_TRUE(t.AllReduceSum(over_all.data(), 5, t.AllRanks(), 60).ok());
    ASSERT_TRUE(reference[r]->AllReduceSum(expected_all.data(), 5, t.AllRanks(), 60).ok());
    EXPECT_EQ(over_all, expected_all);
    if (r != 1) {
      double pair[2] = {1e17 * (r == 0 ? 1 : -1), 1.0};
      auto started = t.StartAllReduceSum(pair, 2, {0, 2});
      ASSERT_TRUE(started.ok()) << started.status();
      ASSERT_TRUE(t.Wait(*started, 60).ok());
      EXPECT_EQ(pair[0], 0.0);
      EXPECT_EQ(pair[1], 2.0);
    }
    EXPECT_EQ(counted[r]->calls, after_creation);  // nothing went through the bootstrap
    EXPECT_EQ(NcclTransportBootstrapSums(t), 0);
    cudaFreeHost(act_out);
    cudaFreeHost(act_in);
    cudaFree(grad_out);
    cudaFree(grad_in);
  });
}

// Messages of one link consumed in another order than sent: NCCL would hand over the wrong
// message silently; the tag that travels ahead of each turns it into an error.
TEST(NcclTransportTest, AMessageConsumedOutOfOrderIsAnErrorNotWrongData) {
  std::vector<std::unique_ptr<Transport>> world = MakeInProcessWorld(2);
  RunRanks(2, [&](int r) {
    auto made = MakeNcclTransport(*world[r], Chain(2));
    ASSERT_TRUE(made.ok()) << made.status();
    std::vector<float> a(16, 1.0f), b(16, 2.0f);
    if (r == 0) {
      auto first = (*made)->Isend(a.data(), 64, 1, 7);
      auto second = (*made)->Isend(b.data(), 64, 1, 8);
      ASSERT_TRUE(first.ok() && second.ok());
      EXPECT_TRUE((*made)->Wait(*first, 60).ok());
      EXPECT_TRUE((*made)->Wait(*second, 60).ok());
    } else {
      auto got = (*made)->Irecv(a.data(), 64, 0, 8);  // expects tag 8 first
      ASSERT_TRUE(got.ok());
      const absl::Status s = (*made)->Wait(*got, 60);
      EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
      EXPECT_NE(s.message().find("came with tag 7"), std::string::npos) << s;
      // The link stays out of step: the next receive gets the next message, tag 8.
      auto rest = (*made)->Irecv(b.data(), 64, 0, 7);
      ASSERT_TRUE(rest.ok());
      const absl::Status next = (*made)->Wait(*rest, 60);
      EXPECT_NE(next.message().find("came with tag 8"), std::string::npos) << next;
    }
  });
}

// A peer that never sends: the wait ends at its deadline with the message named, every
// communicator is aborted, and the transport refuses further work; a slow communication
// stream (every NCCL group of rank 1 starts late) only delays, and Test says when it is done.
TEST(NcclTransportTest, ALatePeerFailsTheWaitAndASlowStreamOnlyDelays) {
  std::vector<std::unique_ptr<Transport>> world = MakeInProcessWorld(2);
  std::atomic<bool> failed{false};
  emu::SetNcclRankDelay(1, 0.02);
  RunRanks(2, [&](int r) {
    auto made = MakeNcclTransport(*world[r], Chain(2));
    ASSERT_TRUE(made.ok()) << made.status();
    Transport& t = **made;
    std::vector<float> buffer(32, static_cast<float>(r));
    // The slow stream: rank 1's receive completes once its late group has run.
    if (r == 0) {
      auto sent = t.Isend(buffer.data(), 128, 1, 1);
      ASSERT_TRUE(sent.ok());
      ASSERT_TRUE(t.Wait(*sent, 60).ok());
    } else {
      auto got = t.Irecv(buffer.data(), 128, 0, 1);
      ASSERT_TRUE(got.ok());
      while (!t.Test(*got)) std::this_thread::yield();
      EXPECT_EQ(buffer[0], 0.0f);  // the data is there once Test says so
      ASSERT_TRUE(t.Wait(*got, 60).ok());
    }
    // The late peer: rank 0 waits for a gradient rank 1 never sends.
    if (r == 0) {
      auto got = t.Irecv(buffer.data(), 128, 1, 2);
      ASSERT_TRUE(got.ok());
      const absl::Status s = t.Wait(*got, 0.2);
      EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
      EXPECT_NE(s.message().find("from rank 1 (tag 2)"), std::string::npos) << s;
      EXPECT_NE(s.message().find("aborted"), std::string::npos) << s;
      EXPECT_EQ(t.Isend(buffer.data(), 128, 1, 3).status().code(),
                absl::StatusCode::kFailedPrecondition);
      failed = true;
    } else {
      // Waits for the deadline to pass over there; its own transport is then destroyed with
      // nothing in flight.
      while (!failed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  emu::SetNcclRankDelay(1, 0);
}

// A rank that takes part in the bootstrap's sum of the ids but never joins the communicators
// (it failed in between): the other's initialisation ends at the deadline naming the rank and
// the link, instead of waiting for it forever.
TEST(NcclTransportTest, ARankThatNeverJoinsFailsTheInitialisationByItsDeadline) {
  std::vector<std::unique_ptr<Transport>> world = MakeInProcessWorld(2);
  NcclTransportOptions options = Chain(2);
  options.timeout_s = 0.2;
  std::atomic<bool> ids_given{false};
  RunRanks(2, [&](int r) {
    if (r == 0) {
      // The ids' sum within the short deadline, however late this thread runs: rank 1's part
      // is already there.
      while (!ids_given) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      auto made = MakeNcclTransport(*world[0], options);
      ASSERT_FALSE(made.ok());
      const absl::Status& s = made.status();
      EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
      EXPECT_NE(s.message().find("the initialisation of the NCCL communicators did not complete "
                                 "within 0.2 s: rank 1 of the link from rank 0 to rank 1 "
                                 "(channel 0) did not come (NCCL communicators aborted)"),
                std::string::npos)
          << s;
    } else {
      // Its part of the ids' sum (three communicators: two links and the group), then nothing.
      std::vector<double> ids(3 * sizeof(ncclUniqueId), 0.0);
      auto sum = world[1]->StartAllReduceSum(ids.data(), static_cast<int64_t>(ids.size()),
                                             world[1]->AllRanks());
      ids_given = true;
      ASSERT_TRUE(sum.ok()) << sum.status();
      EXPECT_TRUE(world[1]->Wait(*sum, 60).ok());
    }
  });
}

// A sum whose other rank never starts it fails at the wait's deadline naming the group.
TEST(NcclTransportTest, ASumWhosePeerNeverComesFailsAtItsDeadline) {
  std::vector<std::unique_ptr<Transport>> world = MakeInProcessWorld(2);
  std::atomic<bool> failed{false};
  RunRanks(2, [&](int r) {
    auto made = MakeNcclTransport(*world[r], Chain(2));
    ASSERT_TRUE(made.ok()) << made.status();
    if (r == 0) {
      double sums[3] = {1, 2, 3};
      const absl::Status s = (*made)->AllReduceSum(sums, 3, {0, 1}, 0.2);
      EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
      EXPECT_NE(s.message().find("the sum of 3 values over ranks {0,1} did not complete within "
                                 "0.2 s (NCCL communicators aborted)"),
                std::string::npos)
          << s;
      failed = true;
    } else {
      while (!failed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
}

}  // namespace
}  // namespace freeride::pipeline
