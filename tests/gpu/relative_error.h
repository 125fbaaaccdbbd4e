// How the GPU suites compare a device result with its CPU reference: the largest absolute
// difference relative to the reference's largest magnitude (‖a − b‖∞ / ‖b‖∞).
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace freeride::testing {

// A NaN on either side is an infinite error (std::max would skip it: a kernel reading
// uninitialised memory must not pass).
inline double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, ref = 1e-30;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = std::fabs(double(a[i]) - b[i]);
    if (std::isnan(d)) return INFINITY;
    diff = std::max(diff, d);
    ref = std::max(ref, std::fabs(double(b[i])));
  }
  return a.size() == b.size() ? diff / ref : INFINITY;
}

}  // namespace freeride::testing
