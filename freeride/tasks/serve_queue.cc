#include "freeride/tasks/serve_queue.h"

#include <algorithm>
#include <chrono>

namespace freeride::serve {
namespace {

constexpr size_t kWindow = 10000;

Percentiles Of(std::deque<double> values) {
  Percentiles p;
  if (values.empty()) return p;
  std::sort(values.begin(), values.end());
  auto at = [&](double q) {
    return values[std::min(values.size() - 1, static_cast<size_t>(q * values.size()))];
  };
  p.p50 = at(0.50), p.p95 = at(0.95), p.p99 = at(0.99);
  return p;
}

std::chrono::duration<double> Seconds(double s) { return std::chrono::duration<double>(s); }

}  // namespace

bool Queue::Push(std::shared_ptr<Completion> c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || static_cast<int64_t>(waiting_.size()) >= capacity_) return false;
    c->request_choices_left = std::make_shared<int64_t>(1);
    waiting_.push_back(std::move(c));
    waiting_count_ = static_cast<int64_t>(waiting_.size());
  }
  arrived_.notify_one();
  return true;
}

bool Queue::PushAll(const std::vector<std::shared_ptr<Completion>>& cs) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || static_cast<int64_t>(waiting_.size() + cs.size()) > capacity_) return false;
    auto left = std::make_shared<int64_t>(static_cast<int64_t>(cs.size()));
    for (const std::shared_ptr<Completion>& c : cs) c->request_choices_left = left;
    waiting_.insert(waiting_.end(), cs.begin(), cs.end());
    waiting_count_ = static_cast<int64_t>(waiting_.size());
  }
  arrived_.notify_all();
  return true;
}

bool Queue::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

std::vector<std::shared_ptr<Completion>> Queue::Take(size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Completion>> out;
  while (!waiting_.empty() && out.size() < n) {
    std::shared_ptr<Completion> c = std::move(waiting_.front());
    waiting_.pop_front();
    if (c->cancelled) {
      ++cancelled_;
      continue;
    }
    out.push_back(std::move(c));
  }
  waiting_count_ = static_cast<int64_t>(waiting_.size());
  return out;
}

void Queue::WaitForWork(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  arrived_.wait_for(lock, Seconds(timeout_s), [&] { return !waiting_.empty() || closed_; });
}

void Queue::Finish(const std::shared_ptr<Completion>& c, double now_s, const std::string& error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    c->done = true;
    ++c->changes;
    c->done_s = now_s;
    c->error = error;
    if (error.empty()) {
      ++choices_;
      // A completion queued alone (or never queued, in tests) is a request of one choice.
      if (!c->request_choices_left || --*c->request_choices_left == 0) ++responses_;
      tokens_ += static_cast<int64_t>(c->generated.size());
      const double first_token_ms = 1e3 * (c->first_token_s - c->arrived_s);
      latency_ms_.push_back(1e3 * (c->done_s - c->arrived_s));
      first_token_ms_.push_back(first_token_ms);
      if (target_ttft_ms_ > 0) ++(first_token_ms <= target_ttft_ms_ ? ttft_met_ : ttft_missed_);
      if (latency_ms_.size() > kWindow) latency_ms_.pop_front(), first_token_ms_.pop_front();
    }
  }
  finished_.notify_all();
}

bool Queue::WaitDone(const std::shared_ptr<Completion>& c, double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  return finished_.wait_for(lock, Seconds(timeout_s), [&] { return c->done; });
}

void Queue::Emit(const std::shared_ptr<Completion>& c, int32_t token) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    c->emitted.push_back(token);
    ++c->changes;
  }
  finished_.notify_all();
}

int64_t Queue::WaitChange(const std::vector<std::shared_ptr<Completion>>& cs, int64_t seen,
                          double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  auto changes = [&] {
    int64_t n = 0;
    for (const auto& c : cs) n += c->changes;
    return n;
  };
  finished_.wait_for(lock, Seconds(timeout_s), [&] { return changes() != seen; });
  return changes();
}

Queue::Progress Queue::Snapshot(const std::shared_ptr<Completion>& c) const {
  std::lock_guard<std::mutex> lock(mu_);
  return {c->emitted, c->done};
}

void Queue::Close(const std::string& reason, double now_s) {
  std::deque<std::shared_ptr<Completion>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    left.swap(waiting_);
    waiting_count_ = 0;
  }
  for (const auto& c : left) Finish(c, now_s, reason);
  arrived_.notify_all();
}

size_t Queue::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_.size();
}

Queue::Stats Queue::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s;
  s.responses = responses_, s.choices = choices_, s.rejected = rejected_, s.cancelled = cancelled_,
  s.tokens = tokens_;
  s.latency_ms = Of(latency_ms_);
  s.first_token_ms = Of(first_token_ms_);
  s.target_ttft_ms = target_ttft_ms_;
  s.ttft_met = ttft_met_, s.ttft_missed = ttft_missed_;
  return s;
}

void Queue::CountRejected() {
  std::lock_guard<std::mutex> lock(mu_);
  ++rejected_;
}

void Queue::CountCancelled() {
  std::lock_guard<std::mutex> lock(mu_);
  ++cancelled_;
}

}  // namespace freeride::serve
