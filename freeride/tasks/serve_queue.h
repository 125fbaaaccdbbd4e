// The `serve` task's requests between the HTTP threads and the bubbles: the network side only
// validates and queues a completion and waits for it; the model side (serve.cc, in bubble
// steps) admits queued requests into decoding slots and fills them in. A request whose client
// went away is cancelled and its slot freed at the next step. A streamed request's handler
// reads each token as it is drawn (Emit, Progress).
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
  std::vector<std::string> stop;  // generation ends before the first of these in the text

  // Filled in by the model side.
  std::vector<int32_t> generated;
  std::string text;           // once done: cut before its stop sequence, if one came
  std::string finish_reason;  // once done: "stop" (a stop sequence) or "length" (max_tokens)
  std::string error;  // set when it can never finish (the task stopped)
  double arrived_s = 0, admitted_s = 0, first_token_s = 0, done_s = 0;
  bool done = false;
  std::atomic<bool> cancelled{false};

  // Guarded by the queue's lock: the tokens drawn so far that no stop sequence took back, and
  // a count of changes (a token emitted, done) that handlers wait on.
  std::vector<int32_t> emitted;
  int64_t changes = 0;
  // The choices of its request not yet served, shared by them (set when queued): the request
  // counts as served when the last of them is.
  std::shared_ptr<int64_t> request_choices_left;
};

// Latency percentiles over the most recent requests.
struct Percentiles {
  double p50 = 0, p95 = 0, p99 = 0;
};

class Queue {
 public:
  // `target_ttft_ms` > 0: each served completion counts as meeting it or not (its time from
  // arrival to first token); 0: no target.
  explicit Queue(int64_t capacity, double target_ttft_ms = 0)
      : capacity_(capacity), target_ttft_ms_(target_ttft_ms) {}

  // False when full (the caller answers 429) or closed (503).
  bool Push(std::shared_ptr<Completion> c);
  // All of `cs` (the choices of one request), or none where they do not all fit.
  bool PushAll(const std::vector<std::shared_ptr<Completion>>& cs);
  bool closed() const;
  // Up to `n` waiting completions, oldest first (cancelled ones dropped).
  std::vector<std::shared_ptr<Completion>> Take(size_t n);
  // Blocks up to `timeout_s` for a completion to arrive (the model side's idle wait).
  void WaitForWork(double timeout_s);
  // Marks `c` done (or failed with `error`) and wakes its waiter.
  void Finish(const std::shared_ptr<Completion>& c, double now_s, const std::string& error = "");
  // Waits up to `timeout_s` for `c` to finish; true when it did.
  bool WaitDone(const std::shared_ptr<Completion>& c, double timeout_s);
  // The model side: `c` drew `token`, which stays in its text.
  void Emit(const std::shared_ptr<Completion>& c, int32_t token);
  // Waits up to `timeout_s` for any of `cs` to change (a token, done) past `seen` changes in
  // all; returns their changes now.
  int64_t WaitChange(const std::vector<std::shared_ptr<Completion>>& cs, int64_t seen,
                     double timeout_s);
  struct Progress {
    std::vector<int32_t> tokens;  // emitted so far
    bool done = false;
  };
  Progress Snapshot(const std::shared_ptr<Completion>& c) const;
  // No more completions: the waiting and the queued ones fail with `reason`.
  void Close(const std::string& reason, double now_s);

  size_t waiting() const;
  // Whether any completion waits, without the lock: the training thread asks between bubble
  // steps, and must not wait on a lock that a thread of the idle class holds.
  bool any_waiting() const { return waiting_count_.load(std::memory_order_relaxed) > 0; }
  struct Stats {
    // Requests whose every choice was served (a response sent), and the choices served: a
    // request for n choices is one response of n choices.
    int64_t responses = 0, choices = 0;
    int64_t rejected = 0, cancelled = 0, tokens = 0;
    Percentiles latency_ms, first_token_ms;
    double target_ttft_ms = 0;              // 0: none
    int64_t ttft_met = 0, ttft_missed = 0;  // served completions against it
  };
  Stats stats() const;
  void CountRejected();
  void CountCancelled();

 private:
  const int64_t capacity_;
  const double target_ttft_ms_;
  mutable std::mutex mu_;
  std::condition_variable arrived_, finished_;
  std::deque<std::shared_ptr<Completion>> waiting_;
  bool closed_ = false;
  std::atomic<int64_t> waiting_count_{0};  // waiting_.size(), written under mu_
  int64_t responses_ = 0, choices_ = 0, rejected_ = 0, cancelled_ = 0, tokens_ = 0;
  int64_t ttft_met_ = 0, ttft_missed_ = 0;
  std::deque<double> latency_ms_, first_token_ms_;  // the last kWindow
};

}  // namespace freeride::serve
