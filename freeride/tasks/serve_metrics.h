// The `serve` task's counters for GET /metrics in Prometheus' text exposition format (0.0.4):
// requests answered by route and status, prompt and completion tokens, histograms of the time
// to the first token and of the whole request, and the gauges the HTTP side reads at scrape
// time (queue depth, slots busy and in all). Thread-safe: every handler thread counts into it.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace freeride::serve {

// A Prometheus histogram: cumulative counts per upper bound (seconds), sum and count.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)), counts_(bounds_.size(), 0) {}
  void Observe(double value);
  // `name`'s _bucket, _sum and _count lines.
  std::string Text(const std::string& name) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bound, not cumulative
  int64_t count_ = 0;
  double sum_ = 0;
};

struct Gauges {
  int64_t queue = 0;         // requests waiting for a slot
  int64_t active_slots = 0;  // slots decoding a request
  int64_t slots = 0;         // args.max_batch
  int64_t rejected = 0;      // turned away (429) since the start, by the queue or the pool
  int64_t cancelled = 0;     // whose client left before the answer
  double target_ttft_ms = 0;              // args.target_ttft_ms; 0: none, and no target lines
  int64_t ttft_met = 0, ttft_missed = 0;  // served completions whose first token met it or not
};

class Metrics {
 public:
  Metrics();
  void CountRequest(const std::string& route, int status);
  void AddTokens(int64_t prompt, int64_t completion);
  // One completion done: seconds from its arrival to its first token and to its end.
  void ObserveLatency(double first_token_s, double total_s);
  std::string Prometheus(const Gauges& gauges) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0;
  Histogram first_token_, total_;
};

// `value` as a Prometheus label value (backslash, quote and newline escaped).
std::string LabelValue(const std::string& value);

}  // namespace freeride::serve
