// The thread an in-process side task runs on: one per task, in SCHED_IDLE (else nice 19;
// core/sched_class.h), so that its code gets a core only when no training thread of any rank
// wants one. The training thread hands it a call (a step, a load) and waits without spinning
// until the call ends or the bubble does; a step still running then goes on at the idle class
// and is collected in a later bubble. Lowering the training thread for the step and restoring it
// after was the other way: restoring needs CAP_SYS_NICE (or RLIMIT_NICE), which cluster users
// seldom have, and a step that outlived its bubble would have held the training thread at the
// idle class.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>

#include "core/sched_class.h"

namespace freeride {

class SideThread {
 public:
  // kIdle: the thread lowers itself first (side work). kCaller: it keeps the class of the
  // thread that made it, for a call the caller waits for whatever it costs (a calibration step
  // measured alone), run apart only so that a hung call can be left behind.
  enum class Class { kIdle, kCaller };
  explicit SideThread(Class sched = Class::kIdle);
  // Joins the thread, or, where a call still runs (a hung task), leaves it to end on its own:
  // whatever the call uses must be owned by the call (captured by value).
  ~SideThread();
  SideThread(const SideThread&) = delete;
  SideThread& operator=(const SideThread&) = delete;

  // Starts `call` on the thread and returns at once; one call at a time (the previous one must
  // have ended: WaitFor returned true).
  void Start(std::function<void()> call);
  // Waits up to `timeout_s` (real time) for the call to end; true when no call runs.
  bool WaitFor(double timeout_s);
  bool busy() const;

  // Moves the thread to the idle class now (SCHED_IDLE, else nice 19), from any thread, a call
  // running on it or not: a thread of the caller's class whose call outlived the bubble it was
  // given. There is no way back without privilege: the thread is spent for that class.
  void Lower();

  // The class the thread got, and its id (for /proc).
  SchedClass sched_class() const;
  pid_t tid() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace freeride
