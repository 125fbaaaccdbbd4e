#include "freeride/tasks/serve_metrics.h"

#include <charconv>

#include "absl/strings/str_cat.h"

namespace freeride::serve {
namespace {

// Seconds: a token in a bubble takes milliseconds, a request in a busy pipeline seconds.
const std::vector<double> kBounds = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};

// The shortest text that reads back as `v` (0.025, not 0.025000000000000001).
std::string Number(double v) {
  char buffer[32];
  const std::to_chars_result r = std::to_chars(buffer, buffer + sizeof(buffer), v);
  return std::string(buffer, r.ptr);
}

void Family(std::string* out, const char* name, const char* type, const char* help) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

}  // namespace

std::string LabelValue(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    out += c == '\n' ? std::string("\\n") : std::string(1, c);
  }
  return out;
}

void Histogram::Observe(double value) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (value <= bounds_[i]) {
      ++counts_[i];
      break;
    }
  }
  ++count_;
  sum_ += value;
}

std::string Histogram::Text(const std::string& name) const {
  std::string out;
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    absl::StrAppend(&out, name, "_bucket{le=\"", Number(bounds_[i]), "\"} ", cumulative, "\n");
  }
  absl::StrAppend(&out, name, "_bucket{le=\"+Inf\"} ", count_, "\n", name, "_sum ", Number(sum_),
                  "\n", name, "_count ", count_, "\n");
  return out;
}

Metrics::Metrics() : first_token_(kBounds), total_(kBounds) {}

void Metrics::CountRequest(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{route, status}];
}

void Metrics::AddTokens(int64_t prompt, int64_t completion) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += prompt;
  completion_tokens_ += completion;
}

void Metrics::ObserveLatency(double first_token_s, double total_s) {
  std::lock_guard<std::mutex> lock(mu_);
  first_token_.Observe(first_token_s);
  total_.Observe(total_s);
}

std::string Metrics::Prometheus(const Gauges& g) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  Family(&out, "freeride_serve_requests_total", "counter",
         "HTTP requests answered, by route and status.");
  for (const auto& [key, n] : requests_) {
    absl::StrAppend(&out, "freeride_serve_requests_total{route=\"", LabelValue(key.first),
                    "\",status=\"", key.second, "\"} ", n, "\n");
  }
  Family(&out, "freeride_serve_rejected_total", "counter",
         "Requests turned away with 429 (queue or connection threads full).");
  absl::StrAppend(&out, "freeride_serve_rejected_total ", g.rejected, "\n");
  Family(&out, "freeride_serve_cancelled_total", "counter",
         "Requests whose client left before the answer.");
  absl::StrAppend(&out, "freeride_serve_cancelled_total ", g.cancelled, "\n");
  Family(&out, "freeride_serve_prompt_tokens_total", "counter", "Prompt tokens accepted.");
  absl::StrAppend(&out, "freeride_serve_prompt_tokens_total ", prompt_tokens_, "\n");
  Family(&out, "freeride_serve_completion_tokens_total", "counter",
         "Tokens generated for completed requests.");
  absl::StrAppend(&out, "freeride_serve_completion_tokens_total ", completion_tokens_, "\n");
  Family(&out, "freeride_serve_time_to_first_token_seconds", "histogram",
         "From a completion's arrival to its first generated token.");
  out += first_token_.Text("freeride_serve_time_to_first_token_seconds");
  if (g.target_ttft_ms > 0) {
    Family(&out, "freeride_serve_ttft_target_seconds", "gauge",
           "The serve task's target time to the first token (args.target_ttft_ms).");
    absl::StrAppend(&out, "freeride_serve_ttft_target_seconds ", Number(g.target_ttft_ms / 1e3),
                    "\n");
    Family(&out, "freeride_serve_ttft_target_total", "counter",
           "Completions served whose first token came within the target, or not.");
    absl::StrAppend(&out, "freeride_serve_ttft_target_total{result=\"met\"} ", g.ttft_met, "\n");
    absl::StrAppend(&out, "freeride_serve_ttft_target_total{result=\"missed\"} ", g.ttft_missed,
                    "\n");
  }
  Family(&out, "freeride_serve_request_duration_seconds", "histogram",
         "From a completion's arrival to its last token.");
  out += total_.Text("freeride_serve_request_duration_seconds");
  Family(&out, "freeride_serve_queue_depth", "gauge", "Completions waiting for a slot.");
  absl::StrAppend(&out, "freeride_serve_queue_depth ", g.queue, "\n");
  Family(&out, "freeride_serve_slots_active", "gauge", "Decoding slots holding a completion.");
  absl::StrAppend(&out, "freeride_serve_slots_active ", g.active_slots, "\n");
  Family(&out, "freeride_serve_slots", "gauge", "Decoding slots in all (args.max_batch).");
  absl::StrAppend(&out, "freeride_serve_slots ", g.slots, "\n");
  return out;
}

}  // namespace freeride::serve
