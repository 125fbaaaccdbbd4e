// The injectable clock: the simulated one moves only when told, by exactly what it is told
// (or, with jitter, by a seeded draw within its bounds, the same in every run); it waits on a
// file descriptor as the system clock does, spending simulated time only when nothing came.
#include "core/clock.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"

namespace freeride {
namespace {

TEST(SimulatedClockTest, MovesOnlyWhenTold) {
  SimulatedClock clock(50.0);
  EXPECT_EQ(clock.Now(), 50.0);
  clock.Sleep(0.25);
  clock.Busy(0.5);
  EXPECT_EQ(clock.Now(), 50.75);
  clock.SpinUntil(51.0);
  EXPECT_EQ(clock.Now(), 51.0);
  clock.SpinUntil(40.0);  // the past: nothing to wait for, and time never goes back
  clock.Advance(-1.0);
  EXPECT_EQ(clock.Now(), 51.0);
  EXPECT_TRUE(clock.simulated());
  EXPECT_FALSE(SystemClock().simulated());
}

TEST(SimulatedClockTest, JitterIsBoundedAndTheSameForTheSameSeed) {
  auto draws = [](uint64_t seed) {
    SimulatedClock clock(0.0, 0.1, seed);
    std::vector<double> steps;
    for (int i = 0; i < 1000; ++i) {
      const double before = clock.Now();
      clock.Busy(1.0);
      steps.push_back(clock.Now() - before);
    }
    return steps;
  };
  const std::vector<double> a = draws(7), b = draws(7), c = draws(8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  double lo = 2, hi = 0, sum = 0;
  for (double s : a) lo = std::min(lo, s), hi = std::max(hi, s), sum += s;
  EXPECT_GE(lo, 0.9);
  EXPECT_LE(hi, 1.1);
  EXPECT_LT(lo, 0.92);  // the draws cover the range
  EXPECT_GT(hi, 1.08);
  EXPECT_NEAR(sum / a.size(), 1.0, 0.01);
  // Waits and sleeps are not work: no jitter.
  SimulatedClock clock(0.0, 0.1, 7);
  clock.Sleep(1.0);
  clock.SpinUntil(3.0);
  EXPECT_EQ(clock.Now(), 3.0);
}

TEST(SimulatedClockTest, WaitsOnADescriptorLikeTheSystemClock) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  SimulatedClock clock(10.0);
  short revents = 0;
  // Nothing to read: the whole wait passes on the simulated clock.
  EXPECT_EQ(clock.WaitReadable(fds[0], 5.0, &revents), 0);
  EXPECT_EQ(clock.Now(), 15.0);
  EXPECT_EQ(SystemClock().WaitReadable(fds[0], 0.0, &revents), 0);
  // Something to read: readable at once, and at most the wait passes.
  ASSERT_EQ(write(fds[1], "x", 1), 1);
  EXPECT_GT(clock.WaitReadable(fds[0], 5.0, &revents), 0);
  EXPECT_TRUE(revents & POLLIN);
  EXPECT_LE(clock.Now(), 20.0);
  EXPECT_GT(SystemClock().WaitReadable(fds[0], 60.0, &revents), 0);
  close(fds[0]);
  close(fds[1]);
}

}  // namespace
}  // namespace freeride
