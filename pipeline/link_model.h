// The links a projection takes from the transport a training would choose (parallel.transport)
// and the fabric between its GPUs: the pipeline link (one stage's message to the next) and the
// data-parallel all-reduce, as α–β networks (network.h).
//   nccl: device buffers straight onto the fabric, with NCCL's per-step latency for it;
//   mpi: the same fabric between hosts, each message and sum staged through host memory over
//     PCIe before and after (the MPI transport's copies; network.h's staging term).
// The figures, with their sources, are in docs/scale.md ("Link models"); they are peak link
// rates, not measured bus bandwidths: a real collective sees less.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pipeline/network.h"

namespace freeride::pipeline {

// NVLink 4 (H100 SXM, 900 GB/s in both directions together): 450 GB/s each way.
inline constexpr double kNvlinkGbs = 450;
// InfiniBand NDR, 400 Gb/s per port, one port per GPU: 50 GB/s.
inline constexpr double kInfinibandGbs = 50;
// NCCL's ring step latency with the Simple protocol over NVLink and over the network.
inline constexpr double kNcclNvlinkStepUs = 3.4;
inline constexpr double kNcclNetStepUs = 9.6;
// PCIe 5.0 ×16, each direction: 32 GT/s × 16 lanes × 128/130 / 8 bits = 63 GB/s.
inline constexpr double kPcie5Gbs = 63;
// One staged copy's latency with its wait (cudaMemcpyAsync, then the stream synchronised):
// an assumption, to be measured on the machine.
inline constexpr double kStagingCopyUs = 10;

struct TransportLinks {
  Network link;             // between adjacent pipeline stages
  Network network;          // the data-parallel all-reduce
  std::string description;  // for the projection's header: what was assumed
};

// `transport`: "nccl" or "mpi"; `fabric`: "nvlink" (every GPU of the job in one NVLink domain)
// or "ib" (between nodes). MPI's host staging does not use NVLink: "mpi" with "nvlink" is
// refused, naming both.
absl::StatusOr<TransportLinks> TransportLinksOf(absl::string_view transport,
                                                absl::string_view fabric);

}  // namespace freeride::pipeline
