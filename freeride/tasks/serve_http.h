// The `serve` task's network side, on cpp-httplib: POST /v1/completions (OpenAI-style), GET
// /health and GET /metrics. A handler validates the request, tokenizes the prompt, queues it
// and waits; it never touches the model, and answers only once the request is done, so every
// answer carries its own status: 200, a 400 with a JSON error naming the field, 429 (the queue
// is full) and 503 (the server stopped) with Retry-After, 504 past the request timeout. While
// it waits it watches the connection: a client that hangs up cancels its request, freeing the
// slot. Under hostile clients: the listening socket is the task's alone (no SO_REUSEPORT: a
// second task on the same port fails to bind); the pool (serve_connections.h) has a thread for
// every request that may wait (queued or decoding) and `threads` more for the quick answers,
// and answers 429 at once where none is free (no queue, no resets in a burst); a request that
// has not arrived whole within read_timeout_s is answered 408 and its connection ended (slow
// clients cannot hold the threads); each connection serves one request.
// /health is 503 "degraded" while requests wait and no bubble has served them lately.
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

// args.port where a config names none (`config check` knows it too: two servers on one port).
inline constexpr int kDefaultPort = 8090;

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = kDefaultPort;         // 0: any free port
  int64_t max_tokens_limit = 256;  // the most a request may ask for
  int64_t vocab_size = 0;          // the model's: prompt tokens must be below it
  int64_t max_seq_len = 0;         // prompt + completion must fit
  double request_timeout_s = 120;  // a request not done by then is answered with an error
  int threads = 16;                // connections served at once beside the waiting requests
  int64_t waiting_limit = 36;      // requests that may wait at once: max_queue + max_batch
  double read_timeout_s = 5;       // a request must arrive whole within this (else 408)
  std::string model_name;
};

class HttpFront {
 public:
  // `degraded` says why requests cannot be served now, or "" when they can.
  HttpFront(HttpOptions options, Queue* queue, Tokenizer* tokenizer,
            std::function<std::string()> metrics_json, std::function<std::string()> degraded);
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
  std::function<std::string()> metrics_json_, degraded_;
  std::atomic<int> listen_fd_{-1};
  std::unique_ptr<httplib::Server> server_;
  std::thread listener_;
  std::atomic<int64_t> next_id_{1};
};

// True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost).
bool IsLoopback(const std::string& host);

}  // namespace freeride::serve
