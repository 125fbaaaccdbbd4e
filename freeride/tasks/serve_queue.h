// The `serve` task's requests between the HTTP threads and the bubbles: the network side only
// validates and queues a completion and waits for it; the model side (serve.cc, in bubble
// steps) admits queued requests into decoding slots and fills them in. A request whose client
// went away is cancelled and its slot freed at the next step.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace freeride::serve {

struct Completion {
  int64_t id = 0;
  std::string prompt;
  std::vector<int32_t> context;  // <|endoftext|> and the prompt's tokens
  int64_t max_tokens = 16;
  double temperature = 1;
  int64_t top_k = 40;
  uint64_t seed = 1337;

  // Filled in by the model side.
  std::vector<int32_t> generated;
  std::string text;
  std::string error;  // set when it can never finish (the task stopped)
  double arrived_s = 0, admitted_s = 0, first_token_s = 0, done_s = 0;
  bool done = false;
  std::atomic<bool> cancelled{false};
};

// Latency percentiles over the most recent requests.
struct Percentiles {
  double p50 = 0, p95 = 0, p99 = 0;
};

class Queue {
 public:
  explicit Queue(int64_t capacity) : capacity_(capacity) {}

  // False when full (the caller answers 429) or closed (503).
  bool Push(std::shared_ptr<Completion> c);
  bool closed() const;
  // Up to `n` waiting completions, oldest first (cancelled ones dropped).
  std::vector<std::shared_ptr<Completion>> Take(size_t n);
  // Blocks up to `timeout_s` for a completion to arrive (the model side's idle wait).
  void WaitForWork(double timeout_s);
  // Marks `c` done (or failed with `error`) and wakes its waiter.
  void Finish(const std::shared_ptr<Completion>& c, double now_s, const std::string& error = "");
  // Waits up to `timeout_s` for `c` to finish; true when it did.
  bool WaitDone(const std::shared_ptr<Completion>& c, double timeout_s);
  // No more completions: the waiting and the queued ones fail with `reason`.
  void Close(const std::string& reason, double now_s);

  size_t waiting() const;
  struct Stats {
    int64_t served = 0, rejected = 0, cancelled = 0, tokens = 0;
    Percentiles latency_ms, first_token_ms;
  };
  Stats stats() const;
  void CountRejected();
  void CountCancelled();

 private:
  const int64_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable arrived_, finished_;
  std::deque<std::shared_ptr<Completion>> waiting_;
  bool closed_ = false;
  int64_t served_ = 0, rejected_ = 0, cancelled_ = 0, tokens_ = 0;
  std::deque<double> latency_ms_, first_token_ms_;  // the last kWindow
};

}  // namespace freeride::serve
