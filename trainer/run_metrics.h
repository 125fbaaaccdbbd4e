// What a metrics row says beyond the step's own numbers: when it was written (UTC), how well
// the devices were used (MFU, against a peak FLOP/s figure whose origin is stated) and how much
// memory the run holds.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "trainer/config/config.h"

namespace freeride {

struct PeakFlops {
  double per_device = 0;  // FLOP/s of one rank's device; 0: unknown, so no MFU
  std::string source;     // where the figure came from, for the log and the "start" record
};

// The dense peak of a known GPU at `precision` ("fp32": no tensor cores, as cuBLAS's
// COMPUTE_32F runs; "bf16"), found by its name in `device` as StageModel::Describe gives it
// ("cuda:0 NVIDIA H100 80GB HBM3 bf16"). per_device is 0 for a device not in the table.
PeakFlops PeakFlopsFromTable(const std::string& device, const std::string& precision);

// What this process's BLAS reaches in a single-precision GEMM (512³, the best of three) on
// its threads: the practical peak of a CPU rank, measured in about 50 ms.
PeakFlops MeasureCpuPeakFlops();

// The figure MFU is taken against: runtime.peak_tflops when set; on a simulated clock the FLOP
// rate compute is simulated at; a GPU from the table; the CPU measured.
PeakFlops ResolvePeakFlops(const Config& config, const std::string& device, bool simulated);

// "2026-11-23T10:15:02.123Z".
std::string Iso8601Utc(std::chrono::system_clock::time_point time);

// The peak resident set of this process (getrusage's ru_maxrss), in bytes.
int64_t PeakRssBytes();

}  // namespace freeride
