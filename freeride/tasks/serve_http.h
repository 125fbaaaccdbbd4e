// The `serve` task's network side, on cpp-httplib: the OpenAI API subset of serve_openai.h
// (POST /v1/completions and /v1/chat/completions, GET /v1/models), GET /health and GET /metrics
// (Prometheus text; ?format=json: the JSON figures). A handler validates the request, tokenizes
// the prompts, queues a completion per choice and waits; it never touches the model. A request
// that does not stream is answered once done, so every answer carries its own status: 200, 400
// (OpenAI's error shape, naming the field), 404 (an unknown route or model), 429 (the queue is
// full) and 503 (the server stopped) with Retry-After, 504 past the request timeout. A streamed
// one is answered 200 at once and sent as server-sent events, each token's text as it is
// drawn, with SSE comment lines while no bubble comes; an error then ends it with an error
// event. While it waits a handler watches the connection: a client that hangs up cancels its
// request, freeing the slot. Under hostile clients: the listening socket is the task's alone (no
// SO_REUSEPORT: a second task on the same port fails to bind); the pool (serve_connections.h) has a
// thread for every request that may wait (queued or decoding) and `threads` more for the quick
// answers, and answers 429 at once where none is free (no queue, no resets in a burst); a request
// that has not arrived whole within read_timeout_s is answered 408 and its connection ended (slow
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
#include "freeride/tasks/serve_metrics.h"
#include "freeride/tasks/serve_openai.h"
#include "freeride/tasks/serve_queue.h"
#include "models/tokenizer.h"

namespace httplib {
class DataSink;
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
  std::string model_name;          // what /v1/models lists and requests name
  int64_t slots = 0;               // decoding slots (args.max_batch), for /metrics
  double keep_alive_s = 5;         // a stream quiet this long gets an SSE comment line
};

struct HttpHooks {
  std::function<std::string()> metrics_json;  // GET /metrics?format=json
  // Why requests cannot be served now, or "" when they can.
  std::function<std::string()> degraded;
  std::function<int64_t()> active_slots;  // slots decoding a request now
};

struct StreamState;  // serve_http.cc

class HttpFront {
 public:
  HttpFront(HttpOptions options, Queue* queue, Tokenizer* tokenizer, HttpHooks hooks);
  ~HttpFront();
  // Binds and starts listening on a thread of its own; the bound port.
  absl::StatusOr<int> Start();
  void Stop();

 private:
  void Completions(Endpoint endpoint, const httplib::Request& request, httplib::Response& response);
  // Streams `cs` (one request's choices) as server-sent events to the end.
  bool Stream(StreamState& state, httplib::DataSink& sink);
  // The answer of a request that does not stream, once its choices are done.
  void Answer(Endpoint endpoint, const std::vector<std::shared_ptr<Completion>>& cs,
              int64_t prompt_tokens, httplib::Response& response);
  void Routes(httplib::Server& s);
  // A choice done without an error: its tokens and latencies are counted.
  void CountDone(const Completion& c);

  HttpOptions options_;
  Queue* queue_;
  Tokenizer* tokenizer_;
  std::mutex encode_mu_;  // Encode caches pieces: one handler at a time
  HttpHooks hooks_;
  Metrics metrics_;
  const int64_t started_ = 0;  // unix seconds: /v1/models' `created`
  std::atomic<int> listen_fd_{-1};
  std::unique_ptr<httplib::Server> server_;
  std::thread listener_;
  std::atomic<int64_t> next_id_{1};
};

// True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost).
bool IsLoopback(const std::string& host);

}  // namespace freeride::serve
