// Finite-difference gradient checks in float64: the independent reference every CPU kernel's
// backward pass is held to.
#pragma once

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace freeride::testing {

inline std::vector<double> RandomVector(size_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<double> v(n);
  for (double& x : v) x = normal(rng);
  return v;
}

inline double Dot(const std::vector<double>& a, const double* b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Compares `analytic` (d loss / d x) with central differences of `loss` at every `stride`-th
// element of x. Errors are measured relative to the gradient's overall scale, so entries that
// are near zero by cancellation do not fail spuriously.
inline void ExpectGradientsMatch(const char* what, double* x, size_t n, const double* analytic,
                                 const std::function<double()>& loss, double tol = 1e-6,
                                 size_t stride = 1, double h = 1e-5) {
  double scale = 1e-12;
  for (size_t i = 0; i < n; ++i) scale = std::max(scale, std::fabs(analytic[i]));
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < n; i += stride) {
    const double saved = x[i];
    x[i] = saved + h;
    const double up = loss();
    x[i] = saved - h;
    const double down = loss();
    x[i] = saved;
    const double numeric = (up - down) / (2 * h);
    const double err = std::fabs(numeric - analytic[i]) / scale;
    if (err > worst) {
      worst = err;
      worst_i = i;
    }
  }
  EXPECT_LT(worst, tol) << what << ": worst relative error at element " << worst_i
                        << " (analytic " << analytic[worst_i] << ")";
}

inline void ExpectGradientsMatch(const char* what, std::vector<double>& x,
                                 const std::vector<double>& analytic,
                                 const std::function<double()>& loss, double tol = 1e-6,
                                 size_t stride = 1, double h = 1e-5) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  ExpectGradientsMatch(what, x.data(), x.size(), analytic.data(), loss, tol, stride, h);
}

}  // namespace freeride::testing
