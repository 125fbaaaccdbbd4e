#include "pipeline/comm/nccl_transport.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/cuda_check.h"
#include "core/status.h"
#include "core/timer.h"
#include "pipeline/comm/nccl_settle.h"
#include "pipeline/comm/nccl_transport_impl.h"

namespace freeride::pipeline {
namespace nccl_internal {

absl::Status NcclTransport::Init(const NcclTransportOptions& options) {
  CUDA_CHECK(cudaSetDevice(device_));
  const int me = rank();
  std::vector<std::vector<int>> specs;
  std::vector<NcclLink> links;
  for (const NcclLink& link : options.links) {
    if (link.sender == link.receiver) continue;  // a copy (SelfCopy)
    if (std::find(links.begin(), links.end(), link) != links.end()) continue;
    links.push_back(link);
    specs.push_back({link.sender, link.receiver});
  }
  tags_per_channel_ = std::max(1, options.tags_per_channel);
  timeout_s_ = options.timeout_s;
  for (const std::vector<int>& group : options.groups) {
    if (group.size() > 1 &&
        std::find(specs.begin() + links.size(), specs.end(), group) == specs.end()) {
      specs.push_back(group);
    }
  }
  // Every communicator's id, made by its first member, in one sum (see NcclComm::Create).
  constexpr int kIdBytes = sizeof(ncclUniqueId);
  std::vector<double> ids(specs.size() * kIdBytes, 0.0);
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i][0] != me) continue;
    ncclUniqueId id;
    NCCL_CHECK(ncclGetUniqueId(&id));
    for (int b = 0; b < kIdBytes; ++b) {
      ids[i * kIdBytes + b] = static_cast<unsigned char>(id.internal[b]);
    }
  }
  FR_RETURN_IF_ERROR(bootstrap_.AllReduceSum(ids.data(), static_cast<int64_t>(ids.size()),
                                             bootstrap_.AllRanks(), options.timeout_s));
  // In the same order everywhere: each rank waits in the first it shares with a rank not yet
  // there, which is never waiting for it; one that never comes fails the deadline.
  const double deadline = MonotonicSeconds() + options.timeout_s;
  for (size_t i = 0; i < specs.size(); ++i) {
    auto at = std::find(specs[i].begin(), specs[i].end(), me);
    if (at == specs[i].end()) continue;
    ncclUniqueId id;
    for (int b = 0; b < kIdBytes; ++b) {
      id.internal[b] = static_cast<char>(static_cast<unsigned char>(ids[i * kIdBytes + b]));
    }
    Comm& c = comms_.emplace_back();  // aborted with the others if it fails
    c.members = specs[i];
    c.name = i < links.size()
                 ? absl::StrFormat("the link from rank %d to rank %d (channel %d)", links[i].sender,
                                   links[i].receiver, links[i].channel)
                 : absl::StrFormat("the group of ranks {%s}", absl::StrJoin(specs[i], ","));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t init =
        ncclCommInitRankConfig(&c.comm, static_cast<int>(specs[i].size()), id,
                               static_cast<int>(at - specs[i].begin()), &config);
    FR_RETURN_IF_ERROR(Settle(c, init, deadline, options.timeout_s,
                              "the initialisation of the NCCL communicators"));
    CUDA_CHECK(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
    if (i < links.size()) {
      link_of_[links[i]] = static_cast<int>(comms_.size() - 1);
    } else {
      group_of_[specs[i]] = static_cast<int>(comms_.size() - 1);
    }
  }
  CUDA_CHECK(cudaStreamCreateWithFlags(&self_stream_, cudaStreamNonBlocking));
  return absl::OkStatus();
}

// Every rank comes here as its trainer goes. First all of them: a send still in flight here
// (one of a step run ahead) waits for its receiver, which may still drain it. Then what is left
// in flight (receives posted ahead, a failed step's, whose sends will never come) would hold the
// streams forever: it is aborted instead.
void NcclTransport::AbortInFlight() {
  if (!closed_) {
    closed_ = true;
    double token[1] = {0};
    // A rank that never comes (it failed) only delays this by the timeout.
    bootstrap_.AllReduceSum(token, 1, bootstrap_.AllRanks(), timeout_s_).IgnoreError();
  }
  AbortLocally();
}

void NcclTransport::AbortLocally() {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return;
  cudaSetDevice(device_);
  bool in_flight = !self_sends_.empty() || !self_recvs_.empty();
  for (auto& [id, p] : requests_) {
    in_flight = in_flight || (p.done != nullptr && cudaEventQuery(p.done) != cudaSuccess);
  }
  if (in_flight) AbortComms();
}

NcclTransport::~NcclTransport() {
  AbortLocally();
  cudaSetDevice(device_);
  for (Comm& c : comms_) {
    if (c.stream != nullptr) cudaStreamSynchronize(c.stream);
    if (!aborted_ && c.comm != nullptr) ncclCommDestroy(c.comm);
    if (c.stream != nullptr) cudaStreamDestroy(c.stream);
  }
  if (self_stream_ != nullptr) {
    cudaStreamSynchronize(self_stream_);
    cudaStreamDestroy(self_stream_);
  }
  for (auto& [id, p] : requests_) {
    if (p.done != nullptr) events_.push_back(p.done);
    if (p.staging != nullptr) cudaFree(p.staging);
    if (p.bounce != nullptr) cudaFreeHost(p.bounce);
    if (p.tag_device != nullptr) cudaFree(p.tag_device);
    if (p.tag_host != nullptr) cudaFreeHost(p.tag_host);
  }
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  for (auto& [bytes, p] : device_pool_) cudaFree(p);
  for (auto& [bytes, p] : pinned_pool_) cudaFreeHost(p);
}

absl::Status NcclTransport::Usable() const {
  if (aborted_) {
    return absl::FailedPreconditionError(
        "the NCCL communicators were aborted after an earlier error");
  }
  return absl::OkStatus();
}

absl::Status NcclTransport::Settle(const Comm& c, ncclResult_t called, double deadline,
                                   double budget_s, const std::string& what) {
  const ncclResult_t state = SettleNccl(c.comm, called, deadline);
  if (state == ncclSuccess) return absl::OkStatus();
  if (state != ncclInProgress) {
    return Abort(absl::UnavailableError(
        absl::StrFormat("NCCL error on %s in %s: %s", c.name, what, ncclGetErrorString(state))));
  }
  std::vector<int> others;
  for (int r : c.members) {
    if (r != rank()) others.push_back(r);
  }
  return Abort(absl::DeadlineExceededError(
      absl::StrFormat("%s did not complete within %.1f s: %s %s of %s did not come", what, budget_s,
                      others.size() == 1 ? "rank" : "ranks", absl::StrJoin(others, ", "), c.name)));
}

absl::Status NcclTransport::Abort(const absl::Status& cause) {
  // NCCL's operations may hang after an error, and a peer may never come: only an abort ends
  // what is in flight, on every communicator.
  AbortComms();
  return absl::Status(cause.code(), absl::StrCat(cause.message(), " (NCCL communicators aborted)"));
}
}  // namespace nccl_internal

absl::StatusOr<std::unique_ptr<Transport>> MakeNcclTransport(Transport& bootstrap,
                                                             const NcclTransportOptions& options) {
  auto transport = std::make_unique<nccl_internal::NcclTransport>(bootstrap, options.device);
  FR_RETURN_IF_ERROR(transport->Init(options));
  return transport;
}

int64_t NcclTransportBootstrapSums(const Transport& transport) {
  const auto* nccl = dynamic_cast<const nccl_internal::NcclTransport*>(&transport);
  return nccl == nullptr ? 0 : nccl->bootstrap_sums();
}

}  // namespace freeride::pipeline
