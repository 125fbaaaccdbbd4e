// What a metrics row says beyond the step's own numbers: when it was written (UTC), how well
// the devices were used (MFU, against a peak FLOP/s figure whose origin is stated) and how much
// memory the run holds.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

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

// One matrix product of a run: [m × k] · [k × n].
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
};

// The products a step of `config`'s model computes on one micro-batch: the attention's QKV and
// output projections, the MLP's two, the LM head. Rows are capped so that each product stays
// under about half a GFLOP, or 64 rows (a GPT-2-sized head would take seconds on a CPU).
std::vector<GemmShape> RunGemmShapes(const Config& config);

// What this process's BLAS reaches in single-precision products of `shapes` on its threads,
// warm (each shape's first product is left out), the best of three per shape, the fastest
// shape's: the practical peak of a CPU rank for the products it will compute.
PeakFlops MeasureCpuPeakFlops(const std::vector<GemmShape>& shapes);

// The figure MFU is taken against: runtime.peak_tflops when set; on a simulated clock the FLOP
// rate compute is simulated at; a GPU from the table; the CPU measured.
PeakFlops ResolvePeakFlops(const Config& config, const std::string& device, bool simulated);

// "2026-11-23T10:15:02.123Z".
std::string Iso8601Utc(std::chrono::system_clock::time_point time);

// The peak resident set of this process (getrusage's ru_maxrss), in bytes.
int64_t PeakRssBytes();

}  // namespace freeride
