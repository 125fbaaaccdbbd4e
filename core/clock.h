// The time that deadlines, pauses and bubble predictions are measured on, injectable. The
// system clock is steady_clock (MonotonicSeconds); a SimulatedClock moves only when told to,
// so code that decides by the time (the side-task executor, its hosts, emulated peers) is
// tested on simulated time: deterministic, whatever else runs on the machine.
#pragma once

#include <atomic>
#include <cstdint>

namespace freeride {

class Clock {
 public:
  virtual ~Clock() = default;
  // Seconds since an arbitrary fixed origin; never goes back.
  virtual double Now() const = 0;
  // Lets `seconds` pass doing nothing: the system clock sleeps, a simulated one advances
  // (after a moment of real sleep, up to 100 µs: what a sleeper waits for may be a real process).
  virtual void Sleep(double seconds) = 0;
  // Lets `seconds` pass as work would: the system clock keeps the CPU busy; a simulated one
  // advances (by `seconds` times its jitter, when it has one).
  virtual void Busy(double seconds) = 0;
  // Waits until `when` polling, as a rank waits for a peer in MPI's progress engine or a stream
  // synchronisation: the system clock keeps the CPU busy; a simulated one moves to `when`.
  virtual void SpinUntil(double when) = 0;
  // Waits until `fd` is readable or `seconds` have passed on this clock, whichever is first;
  // returns ppoll's result (> 0 readable, with `revents`). A simulated clock looks at the fd
  // for a moment of real time (the process behind it is real) and, if nothing came,
  // advances by `seconds`.
  virtual int WaitReadable(int fd, double seconds, short* revents) = 0;
  virtual bool simulated() const { return false; }
};

// steady_clock; the process-wide default wherever no clock is given.
Clock& SystemClock();

// With `jitter` > 0, each Busy takes its time times a factor drawn uniformly from
// [1 - jitter, 1 + jitter] by a generator seeded with `seed`: measurements that vary as on a
// real machine (a study's intervals have a width), and still the same in every run.
class SimulatedClock : public Clock {
 public:
  explicit SimulatedClock(double start_s = 1000.0, double jitter = 0, uint64_t seed = 1)
      : now_(start_s), jitter_(jitter), state_(seed) {}
  double Now() const override { return now_.load(); }
  void Sleep(double seconds) override;
  void Busy(double seconds) override;
  void SpinUntil(double when) override { Advance(when - Now()); }
  int WaitReadable(int fd, double seconds, short* revents) override;
  bool simulated() const override { return true; }
  void Advance(double seconds);

 private:
  std::atomic<double> now_;
  const double jitter_;
  std::atomic<uint64_t> state_;
};

// `clock` when given, else the system clock.
inline Clock& ClockOr(Clock* clock) { return clock != nullptr ? *clock : SystemClock(); }

}  // namespace freeride
