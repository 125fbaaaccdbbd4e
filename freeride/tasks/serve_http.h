// The `serve` task's network side, on cpp-httplib: POST /v1/completions (OpenAI-style), GET
// /health and GET /metrics. A handler validates the request, tokenizes the prompt, queues it
// and waits; it never touches the model. While it waits it sends a space every 200 ms (JSON
// allows leading whitespace): a write that fails means the client went away, and the request
// is cancelled so its slot is freed. Bad input is a 400 with a JSON error naming the field;
// a full queue is a 429 and a stopped server a 503, both with Retry-After.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "freeride/tasks/serve_queue.h"
#include "models/tokenizer.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace freeride::serve {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8090;                 // 0: any free port
  int64_t max_tokens_limit = 256;  // the most a request may ask for
  int64_t vocab_size = 0;          // the model's: prompt tokens must be below it
  int64_t max_seq_len = 0;         // prompt + completion must fit
  double request_timeout_s = 120;  // a request not done by then is answered with an error
  int threads = 16;                // connections served at once
  std::string model_name;
};

class HttpFront {
 public:
  HttpFront(HttpOptions options, Queue* queue, Tokenizer* tokenizer,
            std::function<std::string()> metrics_json);
  ~HttpFront();
  // Binds and starts listening on a thread of its own; the bound port.
  absl::StatusOr<int> Start();
  void Stop();

 private:
  void Completions(const httplib::Request& request, httplib::Response& response);

  HttpOptions options_;
  Queue* queue_;
  Tokenizer* tokenizer_;
  std::mutex encode_mu_;  // Encode caches pieces: one handler at a time
  std::function<std::string()> metrics_json_;
  std::unique_ptr<httplib::Server> server_;
  std::thread listener_;
  std::atomic<int64_t> next_id_{1};
};

// True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost).
bool IsLoopback(const std::string& host);

}  // namespace freeride::serve
