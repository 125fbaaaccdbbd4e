// Synthetic bubbles for the executor's tests: a BUBBLE handed to SideTaskExecutor as the stage
// executor would hand it, its input landing after a set time on the executor's clock.
#pragma once

#include <algorithm>
#include <functional>

#include "core/clock.h"
#include "freeride/executor.h"

namespace freeride::testing {

// One synthetic bubble of `length_s` on `clock` (the executor's); the input is ready after
// `ready_after_s` (at the end when negative); `pollable` false hands the executor no poll at
// all (a sum). Returns how long the executor kept the rank.
inline double Bubble(SideTaskExecutor& ex, double length_s, double ready_after_s = -1,
                     bool pollable = true, int index = 0, Clock& clock = SystemClock()) {
  if (ready_after_s < 0) ready_after_s = length_s;
  pipeline::Instr bubble;
  bubble.op = pipeline::Op::kBubble;
  bubble.bubble = pipeline::BubbleKind::kSteady;
  const double start = clock.Now();
  std::function<bool()> ready;
  if (pollable) {
    ready = [=, &clock] { return clock.Now() >= start + ready_after_s; };
  }
  ex.OnBubble(bubble, index, start, ready);
  const double held = clock.Now() - start;
  clock.SpinUntil(start + length_s);
  ex.OnBubbleEnd(index, std::max(clock.Now(), start + length_s));
  return held;
}

// Bubbles of `length_s` until `done()` holds, at most `cap` of them; whether it came to hold.
inline bool BubblesUntil(SideTaskExecutor& ex, double length_s, double ready_after_s, int cap,
                         const std::function<bool()>& done) {
  for (int i = 0; i < cap && !done(); ++i) Bubble(ex, length_s, ready_after_s);
  return done();
}

}  // namespace freeride::testing
