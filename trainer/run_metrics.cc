#include "trainer/run_metrics.h"

#include <cblas.h>
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <ctime>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "trainer/emulation.h"

namespace freeride {
namespace {

struct GpuPeak {
  const char* name;                 // as it appears in the device's name; the first match wins
  double bf16_tflops, fp32_tflops;  // dense, from NVIDIA's data sheets
};

// More specific names first: "H100 PCIe" before "H100".
constexpr GpuPeak kGpuPeaks[] = {
    {"H200", 989.4, 66.9}, {"H100 PCIe", 756.5, 51.2}, {"H100 NVL", 835.5, 60.0},
    {"H100", 989.4, 66.9}, {"A100", 312.0, 19.5},      {"L40S", 362.05, 91.6},
};

}  // namespace

PeakFlops PeakFlopsFromTable(const std::string& device, const std::string& precision) {
  for (const GpuPeak& gpu : kGpuPeaks) {
    if (!absl::StrContains(device, gpu.name)) continue;
    const double tflops = precision == "bf16" ? gpu.bf16_tflops : gpu.fp32_tflops;
    return {tflops * 1e12,
            absl::StrFormat("from the table: the %s's dense %s peak", gpu.name, precision)};
  }
  return {0, absl::StrFormat("%s is not in the table of peaks: set runtime.peak_tflops", device)};
}

std::vector<GemmShape> RunGemmShapes(const Config& config) {
  const int64_t c = config.model.n_embd, v = config.model.vocab_size;
  const int64_t rows = std::max<int64_t>(1, config.train.batch_size /
                                                std::max<int64_t>(1, config.train.microbatches) *
                                                config.train.seq_len);
  std::vector<GemmShape> shapes;
  for (auto [n, k] : {std::pair{3 * c, c}, {c, c}, {4 * c, c}, {c, 4 * c}, {v, c}}) {
    const int64_t cap = std::max<int64_t>(64, static_cast<int64_t>(2.5e8 / (n * k)));
    shapes.push_back({std::min(rows, cap), n, k});
  }
  return shapes;
}

PeakFlops MeasureCpuPeakFlops(const std::vector<GemmShape>& shapes) {
  double best_flops = 0;
  GemmShape best_shape;
  for (const GemmShape& s : shapes) {
    std::vector<float> a(s.m * s.k, 0.5f), b(s.k * s.n, 0.25f), c(s.m * s.n, 0.0f);
    // The first product warms BLAS's threads and buffers; the best of the next three counts.
    double best_s = 0;
    for (int i = 0; i < 4; ++i) {
      const auto start = std::chrono::steady_clock::now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s.m, s.n, s.k, 1.0f, a.data(), s.k,
                  b.data(), s.n, 0.0f, c.data(), s.n);
      const double t =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (i > 0 && (best_s == 0 || t < best_s)) best_s = t;
    }
    const double flops = 2.0 * s.m * s.n * s.k / std::max(best_s, 1e-9);
    if (flops > best_flops) best_flops = flops, best_shape = s;
  }
  return {best_flops,
          absl::StrFormat("measured: the run's own products on %d threads at start, the fastest "
                          "%d×%d·%d×%d; runtime.peak_tflops states another",
                          omp_get_max_threads(), best_shape.m, best_shape.k, best_shape.k,
                          best_shape.n)};
}

PeakFlops ResolvePeakFlops(const Config& config, const std::string& device, bool simulated) {
  if (config.runtime.peak_tflops > 0) {
    return {config.runtime.peak_tflops * 1e12, "stated: runtime.peak_tflops"};
  }
  if (simulated) {
    return {kSimulatedFlopsPerSecond, "simulated: the rate compute runs at on a simulated clock"};
  }
  if (config.runtime.device == "cuda") return PeakFlopsFromTable(device, config.runtime.precision);
  return MeasureCpuPeakFlops(RunGemmShapes(config));
}

std::string Iso8601Utc(std::chrono::system_clock::time_point time) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(time.time_since_epoch());
  const std::time_t seconds = static_cast<std::time_t>(ms.count() / 1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  return absl::StrFormat("%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900, utc.tm_mon + 1,
                         utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                         static_cast<int>(ms.count() % 1000));
}

int64_t PeakRssBytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace freeride
