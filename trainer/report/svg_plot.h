// Plots as inline SVG for `freeride report`: line and scatter charts on linear axes with
// "nice" ticks in human units (report_format.h), and horizontal bars. Each plot is one
// <svg class="plot"> carrying data-points (how many values it draws), so a test can check that
// every plot has data. Legends sit right of the data area, never on it.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "trainer/report/report_format.h"

namespace freeride {

struct PlotSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y); non-finite values are skipped
  bool markers = false;                           // dots instead of a line
  std::string color = "";  // CSS colour; empty: SeriesColor of its place among the series
};

struct PlotSpec {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool diagonal = false;  // draw y = x (predicted against measured)
  NumberKind x_kind = NumberKind::kCount;
  NumberKind y_kind = NumberKind::kCount;
  bool y_from_zero = false;
  bool legend = false;  // a legend even for one series (which stage it is)  // rates: a bar-like
                        // reading needs the axis to start at 0
  // x intervals drawn as a light band behind the data (the steps that harvested), named
  // `shaded_name` in the legend.
  std::vector<std::pair<double, double>> shaded = {};
  std::string shaded_name = "";
  int width = 520;
  int height = 260;
};

// A chart of the series on shared axes, with a legend when there are several.
std::string LinePlot(const PlotSpec& spec, const std::vector<PlotSeries>& series);

struct BarRow {
  std::string label;
  double total = 0;  // the light bar
  double part = 0;   // the dark bar over it (part of total)
};

// Horizontal bars, one row each, on a shared scale: `total` light with `part` dark over it.
std::string BarPlot(const std::string& title, const std::string& unit,
                    const std::string& total_name, const std::string& part_name,
                    const std::vector<BarRow>& rows);

// Text with &, <, >, " and ' escaped for HTML and SVG.
std::string HtmlEscape(const std::string& text);

}  // namespace freeride
