#include "trainer/report/svg_plot.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace freeride {
namespace {

constexpr int kLeft = 72, kRight = 16, kTop = 30, kBottom = 40;
constexpr int kLegendWidth = 128;  // a column right of the data area

// Ticks at 1, 2 or 5 times a power of ten covering [lo, hi], about `count` of them.
std::vector<double> NiceTicks(double lo, double hi, int count = 5) {
  const double span = hi - lo;
  const double raw = span / count, power = std::pow(10, std::floor(std::log10(raw)));
  const double step = raw / power < 1.5 ? power : raw / power < 3.5 ? 2 * power : 5 * power;
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) {
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  }
  return ticks;
}

// Nice ticks in the unit the axis is written in (0, 50, 100 MiB rather than every 47.68 MiB),
// fewer where their labels would not fit `length` pixels side by side.
std::vector<double> AxisTicks(double lo, double hi, NumberKind kind, double length) {
  const double scale = UnitFor(kind, std::max(std::abs(lo), std::abs(hi))).scale;
  std::vector<double> ticks;
  for (int count = 5; count >= 2; --count) {
    ticks = NiceTicks(lo / scale, hi / scale, count);
    for (double& t : ticks) t *= scale;
    size_t widest = 0;
    for (const std::string& label : TickLabels(ticks, kind))
      widest = std::max(widest, label.size());
    if (static_cast<double>(ticks.size() * (widest * 7 + 8)) <= length) break;
  }
  return ticks;
}

// [lo, hi] of the values, widened when flat so the axis has a span.
std::pair<double, double> Range(const std::vector<double>& values) {
  double lo = *std::min_element(values.begin(), values.end());
  double hi = *std::max_element(values.begin(), values.end());
  if (hi - lo < 1e-12 * std::max(1.0, std::abs(hi))) {
    const double pad = std::max(std::abs(hi) * 0.1, 1e-9);
    lo -= pad, hi += pad;
  }
  return {lo, hi};
}

}  // namespace

std::string HtmlEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string LinePlot(const PlotSpec& spec, const std::vector<PlotSeries>& series) {
  std::vector<double> xs, ys;
  for (const PlotSeries& s : series) {
    for (const auto& [x, y] : s.points) {
      if (std::isfinite(x) && std::isfinite(y)) xs.push_back(x), ys.push_back(y);
    }
  }
  const int w = spec.width, h = spec.height;
  std::string svg = absl::StrFormat(
      "<svg class=\"plot\" data-points=\"%d\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
      "height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\" aria-label=\"%s\">\n"
      "<text x=\"%d\" y=\"18\" class=\"title\">%s</text>\n",
      xs.size(), w, h, w, h, HtmlEscape(spec.title), kLeft, HtmlEscape(spec.title));
  if (xs.empty())
    return absl::StrCat(svg, "<text x=\"", kLeft, "\" y=\"", h / 2, "\">no data</text>\n</svg>\n");
  auto [x0, x1] = Range(xs);
  auto [y0, y1] = Range(ys);
  if (spec.diagonal) x0 = y0 = std::min(x0, y0), x1 = y1 = std::max(x1, y1);
  // Headroom, so that a flat line at the top does not hide in the frame.
  if (spec.y_from_zero) y0 = std::min(0.0, y0), y1 = std::max(0.0, y1 + 0.05 * (y1 - y0));
  const bool legend = series.size() > 1 || !spec.shaded.empty() || spec.legend;
  const double pw = w - kLeft - kRight - (legend ? kLegendWidth : 0), ph = h - kTop - kBottom;
  auto px = [&](double x) { return kLeft + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return kTop + ph - (y - y0) / (y1 - y0) * ph; };
  for (const auto& [a, b] : spec.shaded) {
    const double l = std::clamp(px(a), double{kLeft}, kLeft + pw);
    const double r = std::clamp(px(b), double{kLeft}, kLeft + pw);
    if (r > l) {
      absl::StrAppendFormat(
          &svg, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%.1f\" class=\"shade\"/>\n", l,
          kTop, r - l, ph);
    }
  }
  absl::StrAppendFormat(
      &svg, "<rect x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"%.1f\" class=\"frame\"/>\n", kLeft,
      kTop, pw, ph);
  const std::vector<double> x_ticks = AxisTicks(x0, x1, spec.x_kind, pw);
  const std::vector<double> y_ticks = AxisTicks(y0, y1, spec.y_kind, 1e9);
  const std::vector<std::string> x_labels = TickLabels(x_ticks, spec.x_kind);
  const std::vector<std::string> y_labels = TickLabels(y_ticks, spec.y_kind);
  for (size_t i = 0; i < x_ticks.size(); ++i) {
    const double t = px(x_ticks[i]);
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>"
                          "<text x=\"%.1f\" y=\"%.1f\" class=\"tick\" text-anchor=\"middle\">%s"
                          "</text>\n",
                          t, kTop, t, kTop + ph, t, kTop + ph + 14, x_labels[i]);
  }
  for (size_t i = 0; i < y_ticks.size(); ++i) {
    const double t = py(y_ticks[i]);
    absl::StrAppendFormat(
        &svg,
        "<line x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>"
        "<text x=\"%d\" y=\"%.1f\" class=\"tick\" text-anchor=\"end\">%s</text>\n",
        kLeft, t, kLeft + pw, t, kLeft - 4, t + 4, y_labels[i]);
  }
  absl::StrAppendFormat(
      &svg,
      "<text x=\"%.1f\" y=\"%d\" class=\"axis\" text-anchor=\"middle\">%s</text>\n"
      "<text x=\"10\" y=\"%.1f\" class=\"axis\" text-anchor=\"middle\" "
      "transform=\"rotate(-90 10 %.1f)\">%s</text>\n",
      kLeft + pw / 2, h - 6, HtmlEscape(spec.x_label), kTop + ph / 2, kTop + ph / 2,
      HtmlEscape(spec.y_label));
  if (spec.diagonal) {
    absl::StrAppendFormat(
        &svg, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"diag\"/>\n", px(x0),
        py(y0), px(x1), py(y1));
  }
  const double legend_x = kLeft + pw + 12;
  int entries = 0;
  // `swatch`: the attributes that colour the entry's square.
  auto legend_entry = [&](const std::string& swatch, const std::string& name) {
    const double ly = kTop + 10 + 16 * static_cast<double>(entries++);
    absl::StrAppendFormat(&svg,
                          "<g class=\"legend-entry\"><rect x=\"%.1f\" y=\"%.1f\" width=\"10\" "
                          "height=\"10\" %s/><text x=\"%.1f\" y=\"%.1f\" class=\"legend\">%s"
                          "</text></g>\n",
                          legend_x, ly - 9, swatch, legend_x + 14, ly, HtmlEscape(name));
  };
  for (size_t i = 0; i < series.size(); ++i) {
    const PlotSeries& s = series[i];
    const std::string color = s.color.empty() ? SeriesColor(static_cast<int>(i)) : s.color;
    std::string points;
    // A line needs two points: a series with one finite point is drawn as a dot.
    const bool dots = s.markers || std::count_if(s.points.begin(), s.points.end(), [](auto p) {
                                     return std::isfinite(p.first) && std::isfinite(p.second);
                                   }) == 1;
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      if (dots) {
        absl::StrAppendFormat(&svg, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>",
                              px(x), py(y), color);
      } else {
        absl::StrAppendFormat(&points, "%.1f,%.1f ", px(x), py(y));
      }
    }
    if (!points.empty()) {
      absl::StrAppendFormat(&svg,
                            "<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" "
                            "stroke-width=\"1.5\"/>\n",
                            points, color);
    }
    if (legend) {
      legend_entry(absl::StrCat("fill=\"", color, "\""), s.name);
    }
  }
  if (!spec.shaded.empty()) {
    legend_entry("class=\"shade\"", spec.shaded_name);
  }
  return absl::StrCat(svg, "</svg>\n");
}

std::string BarPlot(const std::string& title, const std::string& unit,
                    const std::string& total_name, const std::string& part_name,
                    const std::vector<BarRow>& rows) {
  constexpr int kLabel = 170, kRow = 20, kWidth = 520;
  const int h = kTop + kRow * static_cast<int>(rows.size()) + 30;
  std::string svg = absl::StrFormat(
      "<svg class=\"plot\" data-points=\"%d\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
      "height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\" aria-label=\"%s\">\n"
      "<text x=\"8\" y=\"18\" class=\"title\">%s</text>\n",
      rows.size(), kWidth, h, kWidth, h, HtmlEscape(title), HtmlEscape(title));
  double top = 0;
  for (const BarRow& r : rows) top = std::max({top, r.total, r.part});
  if (top <= 0) top = 1;
  const double pw = kWidth - kLabel - 90;
  // Seconds in the unit each amount's size picks (12 ms, 1.5 s); other units as counts.
  auto amount = [&](double v) {
    return unit == "s" ? HumanNumber(v, NumberKind::kSeconds)
                       : absl::StrCat(HumanNumber(v), " ", HtmlEscape(unit));
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    const BarRow& r = rows[i];
    const double y = kTop + kRow * static_cast<double>(i);
    absl::StrAppendFormat(
        &svg,
        "<text x=\"%d\" y=\"%.1f\" class=\"tick\" text-anchor=\"end\">%s</text>"
        "<rect x=\"%d\" y=\"%.1f\" width=\"%.1f\" height=\"14\" class=\"bar-total\"/>"
        "<rect x=\"%d\" y=\"%.1f\" width=\"%.1f\" height=\"14\" class=\"bar-part\"/>"
        "<text x=\"%.1f\" y=\"%.1f\" class=\"tick\">%s / %s</text>\n",
        kLabel - 6, y + 11, HtmlEscape(r.label), kLabel, y, r.total / top * pw, kLabel, y,
        std::clamp(r.part / top * pw, 0.0, pw), kLabel + r.total / top * pw + 4, y + 11,
        amount(r.part), amount(r.total));
  }
  const double ly = h - 12;
  absl::StrAppendFormat(&svg,
                        "<rect x=\"%d\" y=\"%.1f\" width=\"10\" height=\"10\" class=\"bar-total\"/>"
                        "<text x=\"%d\" y=\"%.1f\" class=\"legend\">%s</text>"
                        "<rect x=\"%d\" y=\"%.1f\" width=\"10\" height=\"10\" class=\"bar-part\"/>"
                        "<text x=\"%d\" y=\"%.1f\" class=\"legend\">%s</text>\n",
                        kLabel, ly - 9, kLabel + 14, ly, HtmlEscape(total_name), kLabel + 140,
                        ly - 9, kLabel + 154, ly, HtmlEscape(part_name));
  return absl::StrCat(svg, "</svg>\n");
}

}  // namespace freeride
