#include "trainer/report/report_format.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace freeride {
namespace {

struct Step {
  double scale;
  const char* suffix;
};

// Each kind's units, smallest first; an axis takes the largest whose scale its top reaches.
const std::vector<Step>& Units(NumberKind kind) {
  static const std::vector<Step> count = {{1, ""}, {1e3, "K"}, {1e6, "M"}, {1e9, "G"}, {1e12, "T"}};
  static const std::vector<Step> bytes = {{1, " B"},
                                          {1024.0, " KiB"},
                                          {1024.0 * 1024, " MiB"},
                                          {1024.0 * 1024 * 1024, " GiB"},
                                          {1024.0 * 1024 * 1024 * 1024, " TiB"}};
  static const std::vector<Step> seconds = {
      {1e-6, " µs"}, {1e-3, " ms"}, {1, " s"}, {60, " min"}, {3600, " h"}};
  static const std::vector<Step> percent = {{0.01, "%"}};
  switch (kind) {
    case NumberKind::kBytes:
      return bytes;
    case NumberKind::kSeconds:
      return seconds;
    case NumberKind::kPercent:
      return percent;
    case NumberKind::kCount:
      break;
  }
  return count;
}

}  // namespace

NumberUnit UnitFor(NumberKind kind, double top) {
  const std::vector<Step>& units = Units(kind);
  const double magnitude = std::abs(top);
  Step pick = units.front();
  for (const Step& u : units) {
    if (magnitude >= u.scale) pick = u;
  }
  return {pick.scale, pick.suffix};
}

// Past the largest unit (a loss that diverged to 4e23) only an exponent stays readable.
bool BeyondUnits(double value, const NumberUnit& unit) {
  return std::abs(value / unit.scale) >= 1e5;
}

// "4.14e+23": a multiplier (K, M, ...) gives way to the exponent; a unit of measure stays.
std::string WithExponent(double value, const NumberUnit& unit) {
  const bool multiplier = !unit.suffix.empty() && unit.suffix[0] != ' ' && unit.suffix != "%";
  return multiplier ? absl::StrFormat("%.3g", value)
                    : absl::StrFormat("%.3g", value / unit.scale) + unit.suffix;
}

std::string FormatInUnit(double value, const NumberUnit& unit, double step) {
  if (!std::isfinite(value)) return "—";
  if (BeyondUnits(value, unit) || BeyondUnits(step, unit)) return WithExponent(value, unit);
  const double scaled = value / unit.scale;
  // Enough decimals that neighbouring ticks differ (step 0.25 in the unit: two), at most 6.
  int decimals = 0;
  if (step > 0 && std::isfinite(step)) {
    const double in_unit = step / unit.scale;
    while (decimals < 6 && std::abs(in_unit * std::pow(10, decimals) -
                                    std::round(in_unit * std::pow(10, decimals))) >
                               1e-6 * std::max(1.0, in_unit * std::pow(10, decimals))) {
      ++decimals;
    }
  }
  std::string text = absl::StrFormat("%.*f", decimals, scaled);
  if (text.find_first_not_of("-0.") == std::string::npos) {
    // Zero needs no multiplier ("0", not "0K"); a unit of measure stays ("0 ms", "0%").
    const bool multiplier = !unit.suffix.empty() && unit.suffix[0] != ' ' && unit.suffix != "%";
    return multiplier ? "0" : "0" + unit.suffix;
  }
  return text + unit.suffix;
}

std::string HumanNumber(double value, NumberKind kind) {
  if (!std::isfinite(value)) return "—";
  const NumberUnit unit = UnitFor(kind, value);
  if (BeyondUnits(value, unit)) return WithExponent(value, unit);
  const double scaled = std::abs(value / unit.scale);
  // Three significant figures, trailing zeros dropped: 8.1M, 12.3K, 950.
  const int decimals = scaled >= 100 ? 0 : scaled >= 10 ? 1 : 2;
  std::string text = absl::StrFormat("%.*f", decimals, value / unit.scale);
  if (text.find('.') != std::string::npos) {
    text.erase(text.find_last_not_of('0') + 1);
    if (text.back() == '.') text.pop_back();
  }
  if (text == "-0") text = "0";
  return text + unit.suffix;
}

std::vector<std::string> TickLabels(const std::vector<double>& ticks, NumberKind kind) {
  double top = 0;
  for (double t : ticks) top = std::max(top, std::abs(t));
  const NumberUnit unit = UnitFor(kind, top);
  const double step = ticks.size() > 1 ? std::abs(ticks[1] - ticks[0]) : 0;
  std::vector<std::string> labels;
  for (double t : ticks) labels.push_back(FormatInUnit(t, unit, step));
  return labels;
}

std::string StageColor(int stage) {
  static constexpr const char* kStages[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                            "#9467bd", "#8c564b", "#e377c2", "#17becf"};
  constexpr int n = sizeof(kStages) / sizeof(kStages[0]);
  return kStages[((stage % n) + n) % n];
}

std::string SeriesColor(int i) {
  // Disjoint from the stages' colours.
  static constexpr const char* kSeries[] = {"#222222", "#e6a117", "#5e3c99",
                                            "#1b9e77", "#a6761d", "#666666"};
  constexpr int n = sizeof(kSeries) / sizeof(kSeries[0]);
  return kSeries[((i % n) + n) % n];
}

}  // namespace freeride
