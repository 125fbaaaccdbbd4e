// The Transport over NCCL (parallel.transport = "nccl"): point-to-point messages and sums
// between GPUs, each on a communicator of its own, on its own stream, completed by events that
// Test polls and Wait polls with a deadline. After creation no call goes to the bootstrap
// transport (MPI) unless a sum names a group that has no communicator (counted:
// bootstrap_sums()).
//
// NCCL runs a communicator's operations in the order they were issued, and a receive holds
// its communicator until its message comes. The stage executor posts a step's receives when
// the step starts, so each direction of each link (sender → receiver), and on it each channel
// (a virtual stage's activations, or its gradients), has a two-rank communicator of its own: a
// pending receive never holds up a send the other way, nor a message of another chunk. NCCL
// matches a link's messages in order, not by tag: each tag travels ahead of its message, and
// one consumed out of order is an error. Messages to this rank itself are copies on a stream
// of their own, matched by tag.
//
// Buffers may be device memory (used as they are: the stage executor's messages, which the
// chunks allocate on their device for it, CarriesDeviceMemory, and the chunks' gradients,
// summed in place by StartDeviceSum), pinned host memory (copied in stream order) or pageable
// host memory (through a pinned bounce buffer, copied out when the request completes: the
// small sums of host values). A send of a buffer the device is still writing (IsendAfter) and
// a device sum start on their stream after the writer's event: no host wait. Only built with
// the CUDA backend (in the emulation build, over emulated NCCL).
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeline/comm/transport.h"

namespace freeride::pipeline {

// One direction of a link between two ranks, for the messages of one channel: a message with
// tag t travels on the link {sender, receiver, t / tags_per_channel}.
struct NcclLink {
  int sender = 0, receiver = 0, channel = 0;
  auto operator<=>(const NcclLink&) const = default;
};

struct NcclTransportOptions {
  int device = 0;          // this rank's CUDA device
  double timeout_s = 300;  // the bootstrap's and the communicators' initialisation
  // The links that carry messages and the groups (ascending global ranks) that sum; the same
  // lists, in the same order, on every rank.
  std::vector<NcclLink> links;
  int tags_per_channel = 1;
  std::vector<std::vector<int>> groups;
};

// The links and groups of a pp × dp pipeline running `schedule` (rank = replica · pp + stage):
// a link for every sending virtual stage and kind (activations, gradients), whose messages
// both ends handle in micro-batch order (the stage executor's tags: channel = tag / m); and
// the groups that sum: every rank, each replica's stages, each stage's replicas, each
// replica's first and last stage (the tied embedding).
struct Schedule;
NcclTransportOptions PipelineNcclOptions(const Schedule& schedule, int dp);

// Collective over every rank of `bootstrap` (which must outlive the transport: sums over
// groups without a communicator fall back to it): makes the communicators of the links and
// groups this rank is part of, their ids made by their first member and spread in one sum over
// the bootstrap.
absl::StatusOr<std::unique_ptr<Transport>> MakeNcclTransport(Transport& bootstrap,
                                                             const NcclTransportOptions& options);

// How many sums a transport made by MakeNcclTransport handed to its bootstrap (0 for others).
int64_t NcclTransportBootstrapSums(const Transport& transport);

}  // namespace freeride::pipeline
