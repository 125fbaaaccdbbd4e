#include "trainer/run_metrics.h"

#include <cblas.h>
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <ctime>
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

PeakFlops MeasureCpuPeakFlops() {
  constexpr int n = 512;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n, 0.0f);
  double best_s = 0;
  // The first product warms BLAS's threads and buffers; the best of the next three counts.
  for (int i = 0; i < 4; ++i) {
    const auto start = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (i > 0 && (best_s == 0 || s < best_s)) best_s = s;
  }
  const double flops = 2.0 * n * n * n / std::max(best_s, 1e-9);
  return {flops, absl::StrFormat("measured: a %d³ sgemm on %d threads at start; "
                                 "runtime.peak_tflops states another",
                                 n, omp_get_max_threads())};
}

PeakFlops ResolvePeakFlops(const Config& config, const std::string& device, bool simulated) {
  if (config.runtime.peak_tflops > 0) {
    return {config.runtime.peak_tflops * 1e12, "stated: runtime.peak_tflops"};
  }
  if (simulated) {
    return {kSimulatedFlopsPerSecond, "simulated: the rate compute runs at on a simulated clock"};
  }
  if (config.runtime.device == "cuda") return PeakFlopsFromTable(device, config.runtime.precision);
  return MeasureCpuPeakFlops();
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
