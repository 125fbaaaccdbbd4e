// Streams and events of the emulation: each stream runs its work in order on a host thread of
// its own, so that two streams really run at once and a missing event wait is a race, not luck.
// The legacy default stream (null) waits for the blocking streams and runs its work on the
// caller, which is what its implicit synchronisation promises; a cudaStreamNonBlocking stream
// does not synchronise with it. A stream belongs to the context current on the thread that
// made it, and what synchronises the device (the legacy default stream, cudaDeviceSynchronize,
// cudaFree) waits only for the streams of the caller's context: ranks run as threads, each in
// a context of its own, then never wait for each other's streams, as processes do not.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "models/cuda/emulation/include/cuda_runtime_api.h"
#include "models/cuda/emulation/runtime.h"

namespace freeride::emu {

struct Stream {
  Stream(bool blocking_value, int priority_value, int context_value)
      : blocking(blocking_value),
        priority(priority_value),
        context(context_value),
        worker([this] { Work(); }) {}
  ~Stream() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    worker.join();
  }
  void Push(std::function<void()> op) {
    {
      std::lock_guard<std::mutex> lock(mu);
      queue.push_back(std::move(op));
      ++enqueued;
    }
    cv.notify_all();
  }
  // Waits until everything enqueued so far has run.
  void Drain() {
    std::unique_lock<std::mutex> lock(mu);
    const uint64_t target = enqueued;
    cv.wait(lock, [&] { return completed >= target; });
  }
  bool Idle() {
    std::lock_guard<std::mutex> lock(mu);
    return completed == enqueued;
  }
  void Work() {
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      cv.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;
      std::function<void()> op = std::move(queue.front());
      queue.pop_front();
      lock.unlock();
      op();
      lock.lock();
      ++completed;
      cv.notify_all();
    }
  }

  const bool blocking;  // synchronises with the legacy default stream
  const int priority;
  const int context;  // SetThreadContext of the thread that made it
  int draining = 0;  // device-wide drains holding this stream (guarded by Streams::mu)
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
  uint64_t enqueued = 0, completed = 0;
  bool stop = false;
  std::thread worker;  // last: starts once the members above exist
};

struct Event {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;  // records made
  uint64_t reached = 0;   // records whose stream position has been reached
  std::chrono::steady_clock::time_point when{};
  void Reach(uint64_t record) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (record > reached) {
        reached = record;
        when = std::chrono::steady_clock::now();
      }
    }
    cv.notify_all();
  }
  uint64_t Latest() {
    std::lock_guard<std::mutex> lock(mu);
    return recorded;
  }
  void WaitFor(uint64_t record) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return reached >= record; });
  }
};
namespace {

thread_local int current_context = 0;

struct Streams {
  std::mutex mu;
  std::condition_variable released;  // a drain let go of its streams
  std::set<Stream*> all;
};
Streams& TheStreams() {
  static Streams* streams = new Streams;  // outlives the static destructors that synchronise
  return *streams;
}

// The calling context's streams. They are held while they are drained: another thread of the
// context may destroy one meanwhile, and cudaStreamDestroy waits until no drain holds it.
void Drain(bool blocking_only) {
  Streams& s = TheStreams();
  std::vector<Stream*> streams;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    for (Stream* stream : s.all) {
      if (stream->context != current_context || (!stream->blocking && blocking_only)) continue;
      ++stream->draining;
      streams.push_back(stream);
    }
  }
  for (Stream* stream : streams) stream->Drain();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    for (Stream* stream : streams) --stream->draining;
  }
  s.released.notify_all();
}

}  // namespace

void DrainAll() { Drain(false); }
void DrainBlocking() { Drain(true); }

int SetThreadContext(int context) { return std::exchange(current_context, context); }

bool ValidStream(cudaStream_t stream) {
  if (stream == nullptr) return true;
  Streams& s = TheStreams();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.all.count(stream) > 0;
}

void Enqueue(cudaStream_t stream, std::function<void()> op) {
  if (stream == nullptr) {
    DrainBlocking();
    op();
    return;
  }
  stream->Push(std::move(op));
}

}  // namespace freeride::emu

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithPriority(stream, 0, 0);
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  return cudaStreamCreateWithPriority(stream, flags, 0);
}
// Priorities are kept, not honoured: one host thread per stream, scheduled by the OS.
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned flags, int priority) {
  if (flags > cudaStreamNonBlocking) return cudaErrorInvalidValue;
  *stream = new freeride::emu::Stream(!(flags & cudaStreamNonBlocking), priority,
                                      freeride::emu::current_context);
  freeride::emu::Streams& s = freeride::emu::TheStreams();
  std::lock_guard<std::mutex> lock(s.mu);
  s.all.insert(*stream);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream == nullptr || !freeride::emu::ValidStream(stream))
    return cudaErrorInvalidResourceHandle;
  {
    freeride::emu::Streams& s = freeride::emu::TheStreams();
    std::unique_lock<std::mutex> lock(s.mu);
    s.all.erase(stream);
    s.released.wait(lock, [stream] { return stream->draining == 0; });
  }
  stream->Drain();
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (!freeride::emu::ValidStream(stream)) return cudaErrorInvalidResourceHandle;
  if (stream == nullptr) {
    freeride::emu::DrainBlocking();
  } else {
    stream->Drain();
  }
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (!freeride::emu::ValidStream(stream)) return cudaErrorInvalidResourceHandle;
  return stream == nullptr || stream->Idle() ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned /*flags*/) {
  if (event == nullptr || !freeride::emu::ValidStream(stream))
    return cudaErrorInvalidResourceHandle;
  const uint64_t record = event->Latest();  // the most recent record at the time of the call
  if (record == 0) return cudaSuccess;
  freeride::emu::Enqueue(stream, [event, record] { event->WaitFor(record); });
  return cudaSuccess;
}
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  *least = 0;
  *greatest = -5;
  return cudaSuccess;
}
// As the driver reports it: the priority asked for, clamped to the device's range.
cudaError_t cudaStreamGetPriority(cudaStream_t stream, int* priority) {
  if (!freeride::emu::ValidStream(stream)) return cudaErrorInvalidResourceHandle;
  *priority = stream == nullptr ? 0 : std::clamp(stream->priority, -5, 0);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  if (flags > (cudaEventBlockingSync | cudaEventDisableTiming)) return cudaErrorInvalidValue;
  *event = new freeride::emu::Event;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  // CUDA lets a pending event be destroyed; its record still completes. Wait for it here so
  // the stream's op never touches freed memory.
  event->WaitFor(event->Latest());
  delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (event == nullptr || !freeride::emu::ValidStream(stream))
    return cudaErrorInvalidResourceHandle;
  uint64_t record;
  {
    std::lock_guard<std::mutex> lock(event->mu);
    record = ++event->recorded;
  }
  freeride::emu::Enqueue(stream, [event, record] { event->Reach(record); });
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  std::lock_guard<std::mutex> lock(event->mu);
  return event->reached >= event->recorded ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  event->WaitFor(event->Latest());
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (start == nullptr || end == nullptr) return cudaErrorInvalidResourceHandle;
  if (cudaEventQuery(start) != cudaSuccess || cudaEventQuery(end) != cudaSuccess) {
    return cudaErrorNotReady;
  }
  std::scoped_lock lock(start->mu, end->mu);
  *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
  return cudaSuccess;
}
