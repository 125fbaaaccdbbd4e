// How `freeride report` writes numbers and picks colours: tick labels a person reads at a
// glance ("5K", "8.1M", "1.5 GiB", "250 ms" instead of "8.103e+06"), with one unit chosen per
// axis so its ticks compare, and one colour per pipeline stage shared by every plot (stage 0
// is the same blue in the waiting, memory and predicted-against-measured plots).
#pragma once

#include <string>
#include <vector>

namespace freeride {

enum class NumberKind {
  kCount,    // SI suffixes: 950, 5K, 8.1M, 2G
  kBytes,    // binary: 512 B, 3.5 KiB, 1.5 GiB
  kSeconds,  // 250 µs, 15 ms, 1.5 s, 3 min
  kPercent,  // a fraction shown in per cent: 0.25 -> 25%
};

// The scale and suffix an axis whose largest magnitude is `top` writes its ticks in, e.g.
// {1e6, "M"} for counts up to 8.1 million, {1e-3, " ms"} for seconds under one.
struct NumberUnit {
  double scale = 1;
  std::string suffix;
};
NumberUnit UnitFor(NumberKind kind, double top);

// `value` in `unit` with the decimals that tell ticks `step` apart (step 0.5M: "1.5M").
std::string FormatInUnit(double value, const NumberUnit& unit, double step);

// One value on its own, e.g. in a table: three significant figures in the unit its magnitude
// picks ("8.1M", "1.23 GiB", "—" when not finite).
std::string HumanNumber(double value, NumberKind kind = NumberKind::kCount);

// Tick labels for the ticks of one axis (evenly spaced), all in the unit of the largest.
std::vector<std::string> TickLabels(const std::vector<double>& ticks, NumberKind kind);

// The colour of pipeline stage `stage` (CSS hex), the same in every plot of every report.
std::string StageColor(int stage);

// The colour of the i-th of several compared runs or plain series (never a stage's colour
// for i < 4, so a run's line is not mistaken for a stage).
std::string SeriesColor(int i);

}  // namespace freeride
