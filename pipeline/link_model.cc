#include "pipeline/link_model.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace freeride::pipeline {

absl::StatusOr<TransportLinks> TransportLinksOf(absl::string_view transport,
                                                absl::string_view fabric) {
  if (transport != "nccl" && transport != "mpi") {
    return absl::InvalidArgumentError(
        absl::StrCat("--transport: expected nccl or mpi, found '", transport, "'"));
  }
  if (fabric != "nvlink" && fabric != "ib") {
    return absl::InvalidArgumentError(
        absl::StrCat("--fabric: expected nvlink or ib, found '", fabric, "'"));
  }
  if (transport == "mpi" && fabric == "nvlink") {
    return absl::InvalidArgumentError(
        "--transport mpi --fabric nvlink: MPI stages every message through host memory, which "
        "NVLink does not carry; take --fabric ib, or --transport nccl");
  }
  const bool nvlink = fabric == "nvlink";
  Network fabric_net;
  fabric_net.bandwidth_gbs = nvlink ? kNvlinkGbs : kInfinibandGbs;
  fabric_net.latency_us = nvlink ? kNcclNvlinkStepUs : kNcclNetStepUs;
  if (transport == "mpi") {
    fabric_net.staging_gbs = kPcie5Gbs;
    fabric_net.staging_latency_us = kStagingCopyUs;
  }
  TransportLinks links{fabric_net, fabric_net, ""};
  links.description = absl::StrFormat(
      "%s over %s (%.4g GB/s, %.3g µs a step)%s", transport == "nccl" ? "NCCL" : "MPI",
      nvlink ? "NVLink 4" : "InfiniBand NDR", fabric_net.bandwidth_gbs, fabric_net.latency_us,
      transport == "mpi" ? absl::StrFormat(", staged through host memory over PCIe 5.0 (%.4g "
                                           "GB/s, %.3g µs a copy, two copies)",
                                           kPcie5Gbs, kStagingCopyUs)
                         : std::string(", device buffers"));
  return links;
}

}  // namespace freeride::pipeline
