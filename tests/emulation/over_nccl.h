// The NCCL transport for the emulated trainings' ranks (threads of one process), over each
// rank's in-process transport as its bootstrap (the stand-in for MPI), with a counter of the
// calls that reach the bootstrap once the NCCL transport is made: nccl_pipeline_test's and
// zero_cuda_test's "nothing goes through MPI during the steps".
#pragma once

#include <algorithm>
#include <atomic>
#include <memory>
#include <vector>

#include "models/cuda/emulation/runtime.h"
#include "pipeline/comm/nccl_transport.h"
#include "pipeline/comm/transport.h"
#include "trainer/config/config.h"
#include "trainer/transport_choice.h"

namespace freeride::testing {

// Counts every call to the transport it wraps once `armed`.
class CountingTransport : public pipeline::Transport {
 public:
  CountingTransport(Transport& inner, std::atomic<int64_t>* calls) : inner_(inner), calls_(calls) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  absl::StatusOr<Request> Isend(const void* d, int64_t b, int p, int t) override {
    Count();
    return inner_.Isend(d, b, p, t);
  }
  absl::StatusOr<Request> Irecv(void* d, int64_t b, int p, int t) override {
    Count();
    return inner_.Irecv(d, b, p, t);
  }
  absl::Status Wait(Request r, double s) override {
    Count();
    return inner_.Wait(r, s);
  }
  bool Test(Request r) override {
    Count();
    return inner_.Test(r);
  }
  absl::Status AllReduceSum(float* d, int64_t n, const std::vector<int>& g, double s) override {
    Count();
    return inner_.AllReduceSum(d, n, g, s);
  }
  absl::Status AllReduceSum(double* d, int64_t n, const std::vector<int>& g, double s) override {
    Count();
    return inner_.AllReduceSum(d, n, g, s);
  }
  absl::StatusOr<Request> StartAllReduceSum(float* d, int64_t n,
                                            const std::vector<int>& g) override {
    Count();
    return inner_.StartAllReduceSum(d, n, g);
  }
  absl::StatusOr<Request> StartAllReduceSum(double* d, int64_t n,
                                            const std::vector<int>& g) override {
    Count();
    return inner_.StartAllReduceSum(d, n, g);
  }
  bool armed = false;

 private:
  void Count() {
    if (armed) ++*calls_;
  }
  Transport& inner_;
  std::atomic<int64_t>* calls_;
};

// The NCCL transport over each rank's in-process one, through a counter armed once it is made.
// The counting wrapper lives as long as the transport (it is the bootstrap). Made on the rank's
// thread, which it puts in a CUDA context of its own, as each rank's process has: one rank
// freeing memory (cudaFree synchronises the device) then never waits for a peer's collective.
class OverNccl : public pipeline::Transport {
 public:
  static absl::StatusOr<std::unique_ptr<pipeline::Transport>> Make(pipeline::Transport& in_process,
                                                                   const Config& config,
                                                                   std::atomic<int64_t>* calls) {
    emu::SetThreadContext(in_process.rank() + 1);
    auto self = std::unique_ptr<OverNccl>(new OverNccl);
    self->counter_ = std::make_unique<CountingTransport>(in_process, calls);
    absl::StatusOr<pipeline::NcclTransportOptions> options = NcclOptionsOf(config);
    if (!options.ok()) return options.status();
    auto made = pipeline::MakeNcclTransport(*self->counter_, *options);
    if (!made.ok()) return made.status();
    self->nccl_ = *std::move(made);
    self->counter_->armed = true;
    return std::unique_ptr<pipeline::Transport>(std::move(self));
  }
  int rank() const override { return nccl_->rank(); }
  int size() const override { return nccl_->size(); }
  absl::StatusOr<Request> Isend(const void* d, int64_t b, int p, int t) override {
    return nccl_->Isend(d, b, p, t);
  }
  absl::StatusOr<Request> IsendAfter(const void* d, int64_t b, int p, int t, void* w) override {
    return nccl_->IsendAfter(d, b, p, t, w);
  }
  absl::StatusOr<Request> Irecv(void* d, int64_t b, int p, int t) override {
    return nccl_->Irecv(d, b, p, t);
  }
  bool CarriesDeviceMemory() const override { return nccl_->CarriesDeviceMemory(); }
  absl::Status Wait(Request r, double s) override {
    return nccl_->Wait(r, std::max(s, min_timeout_s));
  }
  bool Test(Request r) override { return nccl_->Test(r); }
  absl::Status AllReduceSum(float* d, int64_t n, const std::vector<int>& g, double s) override {
    return Sum(d, n, g, s);
  }
  absl::Status AllReduceSum(double* d, int64_t n, const std::vector<int>& g, double s) override {
    return Sum(d, n, g, s);
  }
  absl::StatusOr<Request> StartAllReduceSum(float* d, int64_t n,
                                            const std::vector<int>& g) override {
    return nccl_->StartAllReduceSum(d, n, g);
  }
  absl::StatusOr<Request> StartAllReduceSum(double* d, int64_t n,
                                            const std::vector<int>& g) override {
    return nccl_->StartAllReduceSum(d, n, g);
  }
  absl::StatusOr<Request> StartDeviceSum(const std::vector<DeviceRange>& ranges,
                                         const std::vector<int>& g, void* ready) override {
    return nccl_->StartDeviceSum(ranges, g, ready);
  }
  absl::StatusOr<Request> StartDeviceRooted(DeviceRooted kind,
                                            const std::vector<DeviceRange>& ranges,
                                            const std::vector<int>& roots,
                                            const std::vector<int>& g, void* ready) override {
    return nccl_->StartDeviceRooted(kind, ranges, roots, g, ready);
  }
  void OnStepStart(double now_s) override { nccl_->OnStepStart(now_s); }
  // Waits take at least this long to time out: a test's short deadline for the step only.
  double min_timeout_s = 0;
  // Set once a blocking sum has been started here (its NCCL operation is on the stream).
  std::atomic<bool>* summing = nullptr;
  // The trainer goes: what the transport says to the bootstrap from here on is teardown.
  void AbortInFlight() override {
    counter_->armed = false;
    nccl_->AbortInFlight();
  }

 private:
  OverNccl() = default;
  template <typename T>
  absl::Status Sum(T* d, int64_t n, const std::vector<int>& g, double s) {
    absl::StatusOr<Request> started = nccl_->StartAllReduceSum(d, n, g);
    if (!started.ok()) return started.status();
    if (summing != nullptr) *summing = true;
    return nccl_->Wait(*started, std::max(s, min_timeout_s));
  }
  std::unique_ptr<CountingTransport> counter_;
  std::unique_ptr<pipeline::Transport> nccl_;  // destroyed before the counter it bootstraps on
};

}  // namespace freeride::testing
