#include "freeride/side_thread.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>

namespace freeride {

// Shared by the handle and the thread: a thread left running by the destructor keeps it alive.
struct SideThread::State {
  std::mutex mu;
  std::condition_variable cv;
  std::function<void()> call;  // the call to start; empty when none waits
  bool running = false;        // a call started and has not ended
  bool quit = false;
  bool started = false;        // the thread has lowered itself and published its id
  SchedClass sched_class = SchedClass::kNormal;
  pid_t tid = 0;
  std::thread thread;
};

SideThread::SideThread(Class sched) : state_(std::make_shared<State>()) {
  std::shared_ptr<State> s = state_;
  s->thread = std::thread([s, sched] {
    SchedClass lowered = SchedClass::kNormal;
    if (sched == Class::kIdle) {
      lowered = LowerCallingThread();
    } else if (absl::StatusOr<ThreadSched> own = ReadThreadSched(getpid(), CurrentThreadId());
               own.ok()) {
      lowered = own->sched_class();
    }
    std::unique_lock<std::mutex> lock(s->mu);
    s->sched_class = lowered;
    s->tid = CurrentThreadId();
    s->started = true;
    s->cv.notify_all();
    while (true) {
      s->cv.wait(lock, [&] { return s->quit || static_cast<bool>(s->call); });
      if (!s->call) return;  // quit with nothing to run
      std::function<void()> call = std::move(s->call);
      s->call = nullptr;
      lock.unlock();
      call();
      lock.lock();
      s->running = false;
      s->cv.notify_all();
      if (s->quit) return;
    }
  });
  std::unique_lock<std::mutex> lock(s->mu);
  s->cv.wait(lock, [&] { return s->started; });
}

SideThread::~SideThread() {
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->quit = true;
  state_->cv.notify_all();
  const bool left_running = state_->running;
  lock.unlock();
  if (left_running) {
    state_->thread.detach();
  } else {
    state_->thread.join();
  }
}

void SideThread::Start(std::function<void()> call) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->call = std::move(call);
  state_->running = true;
  state_->cv.notify_all();
}

bool SideThread::WaitFor(double timeout_s) {
  std::unique_lock<std::mutex> lock(state_->mu);
  return state_->cv.wait_for(lock, std::chrono::duration<double>(timeout_s),
                             [&] { return !state_->running; });
}

bool SideThread::busy() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->running;
}

void SideThread::Lower() {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->sched_class != SchedClass::kNormal) return;
  state_->sched_class = LowerThread(state_->tid);
}

SchedClass SideThread::sched_class() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->sched_class;
}

pid_t SideThread::tid() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->tid;
}

}  // namespace freeride
