#include "pipeline/network.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace freeride::pipeline {

absl::StatusOr<AllReduceAlgorithm> ParseAllReduceAlgorithm(absl::string_view name) {
  if (name == "ring") return AllReduceAlgorithm::kRing;
  if (name == "tree") return AllReduceAlgorithm::kTree;
  return absl::InvalidArgumentError(
      absl::StrCat("all-reduce algorithm: expected \"ring\" or \"tree\", found \"", name, "\""));
}

absl::string_view AllReduceAlgorithmName(AllReduceAlgorithm algorithm) {
  return algorithm == AllReduceAlgorithm::kRing ? "ring" : "tree";
}

namespace {

// The copy out to host memory and the copy back: 2·(α_s + bytes/β_s), 0 without staging.
double StagingMs(const Network& network, double bytes) {
  if (network.staging_gbs <= 0) return 0;
  return 2 * (network.staging_latency_us * 1e-3 + bytes * 1e3 / (network.staging_gbs * 1e9));
}

}  // namespace

double AllReduceMs(AllReduceAlgorithm algorithm, const Network& network, double bytes,
                   int64_t ranks) {
  if (ranks <= 1) return 0;
  const double staging_ms = StagingMs(network, bytes);
  const double alpha_ms = network.latency_us * 1e-3;
  const double ms_per_byte = 1e3 / (network.bandwidth_gbs * 1e9);
  const double n = static_cast<double>(ranks);
  if (algorithm == AllReduceAlgorithm::kRing) {
    return staging_ms + 2 * (n - 1) * alpha_ms + 2 * (n - 1) / n * bytes * ms_per_byte;
  }
  return staging_ms + 2 * std::ceil(std::log2(n)) * alpha_ms + 2 * bytes * ms_per_byte;
}

double PointToPointMs(const Network& network, double bytes) {
  return StagingMs(network, bytes) + network.latency_us * 1e-3 +
         bytes * 1e3 / (network.bandwidth_gbs * 1e9);
}

}  // namespace freeride::pipeline
