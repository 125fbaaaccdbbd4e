#include "core/clock.h"

#include <poll.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "core/timer.h"

namespace freeride {
namespace {

int Poll(int fd, double seconds, short* revents) {
  pollfd p{fd, POLLIN, 0};
  const double s = std::max(0.0, seconds);
  const timespec wait{static_cast<time_t>(s), static_cast<long>((s - std::floor(s)) * 1e9)};
  const int r = ppoll(&p, 1, &wait, nullptr);
  if (revents != nullptr) *revents = p.revents;
  return r;
}

class SteadyClock : public Clock {
 public:
  double Now() const override { return MonotonicSeconds(); }
  void Sleep(double seconds) override {
    if (seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  }
  // Polls rather than sleeps: a sleep overshoots by ~0.1 ms or more on a VM, and a rank that
  // waits for a peer spins in MPI's progress engine (or a stream synchronisation) the same way.
  void Busy(double seconds) override {
    const double until = MonotonicSeconds() + seconds;
    while (MonotonicSeconds() < until) std::this_thread::yield();
  }
  int WaitReadable(int fd, double seconds, short* revents) override {
    return Poll(fd, seconds, revents);
  }
};

}  // namespace

Clock& SystemClock() {
  static SteadyClock clock;
  return clock;
}

void SimulatedClock::Advance(double seconds) {
  if (seconds <= 0) return;
  double now = now_.load();
  while (!now_.compare_exchange_weak(now, now + seconds)) {
  }
}

int SimulatedClock::WaitReadable(int fd, double seconds, short* revents) {
  // A millisecond of real time for the process on the other end to answer; no answer within it
  // is, on this clock, no answer within `seconds`.
  const int r = Poll(fd, 1e-3, revents);
  if (r == 0) Advance(seconds);
  return r;
}

}  // namespace freeride
