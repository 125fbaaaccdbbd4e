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
  void Busy(double seconds) override { SpinUntil(MonotonicSeconds() + seconds); }
  void SpinUntil(double when) override {
    while (MonotonicSeconds() < when) std::this_thread::yield();
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
  if (!(seconds > 0) || !std::isfinite(seconds)) return;  // never back, never to infinity
  double now = now_.load();
  while (!now_.compare_exchange_weak(now, now + seconds)) {
  }
}

void SimulatedClock::Sleep(double seconds) {
  if (seconds <= 0) return;
  std::this_thread::sleep_for(std::chrono::duration<double>(std::min(seconds, 1e-4)));
  Advance(seconds);
}

void SimulatedClock::Busy(double seconds) {
  if (jitter_ <= 0) return Advance(seconds);
  // SplitMix64: one draw per call, the same sequence for the same seed.
  uint64_t z = state_.fetch_add(0x9e3779b97f4a7c15ULL) + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  const double u = static_cast<double>(z >> 11) * 0x1.0p-53;  // [0, 1)
  Advance(seconds * (1 + jitter_ * (2 * u - 1)));
}

int SimulatedClock::WaitReadable(int fd, double seconds, short* revents) {
  // The process on the other end is real: it has a millisecond of real time to answer, and
  // the time it took passes on this clock too (a step that answers at once is not free). No
  // answer within it is, on this clock, no answer within `seconds`.
  const double start = MonotonicSeconds();
  const int r = Poll(fd, 1e-3, revents);
  Advance(r == 0 ? seconds : std::min(seconds, MonotonicSeconds() - start));
  return r;
}

}  // namespace freeride
