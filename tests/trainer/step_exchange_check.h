// The step exchange's round trip over any transport: every rank fills the parts of it that are
// its own (its stage, the bubbles it ran, a share of the jobs' values and the step time), and
// after the sum each rank reads every rank's fields back by name, exactly.
#pragma once

#include "gtest/gtest.h"
#include "pipeline/comm/transport.h"
#include "trainer/step_exchange.h"

namespace freeride::testing {

// Collective: every rank of `t` calls it. Stage r is rank r's; it ran bubble 2r, not 2r + 1.
inline void ExpectStepExchangeRoundTrip(pipeline::Transport& t) {
  const int n = t.size(), r = t.rank();
  StepExchange e = StepExchange::Shaped(n, 2 * static_cast<size_t>(n), 3, true);
  e.stages[r] = {0.25 + r, 1e9 * (r + 1), 3e6 * r};
  e.stop_requests = r == 1 ? 1 : 0;
  e.bubbles[2 * r] = {true, 0.001 * (r + 1), 0.002 * (r + 1), 0.0005 * r};
  for (double& j : e.jobs) j = 1;
  e.step_s_sum = 0.5 * r;
  std::vector<double> values = e.Pack();
  ASSERT_TRUE(
      t.AllReduceSum(values.data(), static_cast<int64_t>(values.size()), t.AllRanks(), 60).ok());
  StepExchange summed = StepExchange::Shaped(n, 2 * static_cast<size_t>(n), 3, true);
  ASSERT_TRUE(summed.Unpack(values).ok());
  for (int k = 0; k < n; ++k) {
    EXPECT_EQ(summed.stages[k].bubble_s, 0.25 + k) << k;
    EXPECT_EQ(summed.stages[k].host_peak_bytes, 1e9 * (k + 1)) << k;
    EXPECT_EQ(summed.stages[k].device_bytes, 3e6 * k) << k;
    EXPECT_TRUE(summed.bubbles[2 * k].ran) << k;
    EXPECT_EQ(summed.bubbles[2 * k].predicted_s, 0.001 * (k + 1)) << k;
    EXPECT_EQ(summed.bubbles[2 * k].measured_s, 0.002 * (k + 1)) << k;
    EXPECT_EQ(summed.bubbles[2 * k].harvested_s, 0.0005 * k) << k;
    EXPECT_FALSE(summed.bubbles[2 * k + 1].ran) << k;
  }
  EXPECT_EQ(summed.stop_requests, n > 1 ? 1 : 0);
  for (double j : summed.jobs) EXPECT_EQ(j, n);
  ASSERT_TRUE(summed.step_s_sum.has_value());
  EXPECT_EQ(*summed.step_s_sum, 0.25 * n * (n - 1));
}

}  // namespace freeride::testing
