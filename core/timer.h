// Monotonic wall-clock time for step timing and bubble accounting (steady_clock: never jumps
// when the system clock is adjusted).
#pragma once

#include <chrono>

namespace freeride {

// Seconds on the monotonic clock since an arbitrary fixed origin (same origin process-wide).
inline double MonotonicSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class Timer {
 public:
  Timer() : start_(std::chrono::steady_clock::now()) {}
  void Restart() { start_ = std::chrono::steady_clock::now(); }
  double ElapsedSeconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace freeride
