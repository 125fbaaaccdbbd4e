// Communication times from the α–β model: a message costs its latency α plus its bytes over the
// bandwidth β. The collectives follow the algorithms NCCL and MPI use for large messages:
//   ring all-reduce over n ranks: reduce-scatter then all-gather, 2(n−1) steps each moving
//     bytes/n: 2(n−1)·α + 2·(n−1)/n · bytes/β;
//   tree all-reduce (a reduction up a binary tree and a broadcast down it, pipelined in chunks
//     so that the depth costs latency only): 2·⌈log2 n⌉·α + 2 · bytes/β.
// β is the per-rank bus bandwidth a collective sees (NCCL's "busbw"), not a link's peak.
// Host staging (MPI on GPUs: the device's data copied to host memory before, and back after,
// over PCIe, whole, not overlapped with the transfer) adds 2·(α_s + bytes/β_s) to either.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace freeride::pipeline {

struct Network {
  double latency_us = 5;      // α, per message step
  double bandwidth_gbs = 25;  // β, in 10^9 bytes per second
  // Host staging: β_s of each copy between device and host (0: none, the data is where it is
  // sent from), and α_s, each copy's latency with its wait.
  double staging_gbs = 0;
  double staging_latency_us = 0;
};

enum class AllReduceAlgorithm { kRing, kTree };
absl::StatusOr<AllReduceAlgorithm> ParseAllReduceAlgorithm(absl::string_view name);
absl::string_view AllReduceAlgorithmName(AllReduceAlgorithm algorithm);

// Milliseconds to all-reduce `bytes` over `ranks` (0 for one rank).
double AllReduceMs(AllReduceAlgorithm algorithm, const Network& network, double bytes,
                   int64_t ranks);
// Milliseconds for one point-to-point message of `bytes`.
double PointToPointMs(const Network& network, double bytes);

}  // namespace freeride::pipeline
