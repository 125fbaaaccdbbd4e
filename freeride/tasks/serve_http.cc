#include "freeride/tasks/serve_http.h"

#include <httplib.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/timer.h"
#include "freeride/tasks/serve_connections.h"

namespace freeride::serve {
namespace {

using nlohmann::json;

void Error(httplib::Response& res, int status, const std::string& message,
           const std::string& type = "invalid_request_error") {
  res.status = status;
  res.set_content(json{{"error", {{"message", message}, {"type", type}}}}.dump() + "\n",
                  "application/json");
}

// Reads an integer field in [lo, hi], or says why not.
bool IntField(const json& body, const char* key, int64_t lo, int64_t hi, int64_t* out,
              std::string* why) {
  if (!body.contains(key)) return true;
  const json& v = body[key];
  if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
    *why = absl::StrCat("'", key, "' must be an integer in [", lo, ", ", hi, "], found ", v.dump());
    return false;
  }
  *out = v.get<int64_t>();
  return true;
}

// Whether the client hung up (or reset) the connection.
bool ClientLeft(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

HttpFront::HttpFront(HttpOptions options, Queue* queue, Tokenizer* tokenizer,
                     std::function<std::string()> metrics_json,
                     std::function<std::string()> degraded)
    : options_(std::move(options)),
      queue_(queue),
      tokenizer_(tokenizer),
      metrics_json_(std::move(metrics_json)),
      degraded_(std::move(degraded)),
      server_(std::make_unique<httplib::Server>()) {}

HttpFront::~HttpFront() { Stop(); }

absl::StatusOr<int> HttpFront::Start() {
  httplib::Server& s = *server_;
  // A thread for each request that may wait, `threads` more for quick answers; a connection
  // that finds them all busy is answered 429 at once (serve_connections.h).
  const int threads = static_cast<int>(options_.threads + options_.waiting_limit);
  s.new_task_queue = [this, threads] {
    return new ConnectionPool(threads, listen_fd_, options_.read_timeout_s,
                              [this] { queue_->CountRejected(); });
  };
  s.set_payload_max_length(1 << 20);
  s.set_keep_alive_max_count(1);
  // The pool's deadline for the whole request ends a slow one with a 408; cpp-httplib's own
  // timeouts (the first byte, each read) are a second later, so that they never end a
  // connection first and without an answer.
  const double read_s = options_.read_timeout_s + 1;
  s.set_keep_alive_timeout(static_cast<time_t>(std::ceil(read_s)));
  s.set_read_timeout(static_cast<time_t>(read_s),
                     static_cast<time_t>((read_s - std::floor(read_s)) * 1e6));
  const auto write_timeout = static_cast<int64_t>(options_.read_timeout_s * 1e6);
  s.set_write_timeout(write_timeout / 1000000, write_timeout % 1000000);
  // Not cpp-httplib's default SO_REUSEPORT, with which a second server on the port would take
  // half of the connections silently.
  s.set_socket_options([this](int fd) {
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd_ = fd;
  });
  // cpp-httplib's own answers (400 for a malformed request, 404, 413) come once the request is
  // read: the pool's deadline is over for them too.
  s.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request&, httplib::Response&) {
        ConnectionPool::EnterHandler();
        return httplib::Server::HandlerResponse::Unhandled;
      }));
  s.Post("/v1/completions",
         [this](const httplib::Request& req, httplib::Response& res) { Completions(req, res); });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    ConnectionPool::EnterHandler();
    if (queue_->closed()) {
      res.status = 503;
      res.set_content(json{{"status", "stopped"}}.dump() + "\n", "application/json");
      return;
    }
    const std::string why = degraded_();
    res.status = why.empty() ? 200 : 503;
    json body{{"status", why.empty() ? "ok" : "degraded"}};
    if (!why.empty()) body["reason"] = why;
    res.set_content(body.dump() + "\n", "application/json");
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    ConnectionPool::EnterHandler();
    res.set_content(metrics_json_(), "application/json");
  });
  int port = options_.port;
  if (port == 0) {
    port = s.bind_to_any_port(options_.host);
    if (port < 0) return absl::UnavailableError("could not bind any port on " + options_.host);
  } else if (!s.bind_to_port(options_.host, port)) {
    return absl::UnavailableError(absl::StrCat("could not bind ", options_.host, ":", port,
                                               " (in use, or not an address of this machine)"));
  }
  // The accept loop never waits (a busy pool answers 429 itself), so the backlog only has to
  // hold the connections of a burst between two accepts; a SYN beyond it is dropped (the client
  // retries it a second later), never reset.
  if (listen(listen_fd_, std::max(2 * threads, 512)) != 0) {
    return absl::UnavailableError(absl::StrCat("could not listen on ", options_.host, ":", port));
  }
  listener_ = std::thread([this] { server_->listen_after_bind(); });
  return port;
}

void HttpFront::Stop() {
  if (server_) server_->stop();
  if (listener_.joinable()) listener_.join();
}

void HttpFront::Completions(const httplib::Request& req, httplib::Response& res) {
  const int connection = ConnectionPool::EnterHandler();
  const json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) {
    return Error(res, 400, "the body is not a JSON object");
  }
  static const std::vector<std::string> kKnown = {"prompt", "max_tokens", "temperature",
                                                  "top_k",  "seed",       "model"};
  std::vector<std::string> unknown;
  for (const auto& [key, value] : body.items()) {
    if (std::find(kKnown.begin(), kKnown.end(), key) == kKnown.end()) unknown.push_back(key);
  }
  if (!unknown.empty()) {
    return Error(res, 400,
                 absl::StrCat("unknown fields: ", absl::StrJoin(unknown, ", "), "; expected ",
                              absl::StrJoin(kKnown, ", ")));
  }
  if (!body.contains("prompt") || !body["prompt"].is_string()) {
    return Error(res, 400, "'prompt' (a string) is required");
  }
  auto c = std::make_shared<Completion>();
  c->prompt = body["prompt"].get<std::string>();
  std::string why;
  int64_t seed = static_cast<int64_t>(c->seed);
  if (!IntField(body, "max_tokens", 1, options_.max_tokens_limit, &c->max_tokens, &why) ||
      !IntField(body, "top_k", 0, int64_t{1} << 24, &c->top_k, &why) ||
      !IntField(body, "seed", 0, int64_t{1} << 62, &seed, &why)) {
    return Error(res, 400, why);
  }
  c->seed = static_cast<uint64_t>(seed);
  if (body.contains("temperature")) {
    const json& t = body["temperature"];
    if (!t.is_number() || t.get<double>() < 0 || t.get<double>() > 100) {
      return Error(res, 400, "'temperature' must be a number in [0, 100], found " + t.dump());
    }
    c->temperature = t.get<double>();
  }
  absl::StatusOr<std::vector<int32_t>> ids;
  {
    std::lock_guard<std::mutex> lock(encode_mu_);
    ids = tokenizer_->Encode(c->prompt);
  }
  if (!ids.ok()) return Error(res, 400, std::string(ids.status().message()));
  for (int32_t id : *ids) {
    if (id >= options_.vocab_size) {
      return Error(res, 400,
                   absl::StrCat("the prompt has token ", id, ", outside this model's ",
                                options_.vocab_size, "-token vocabulary"));
    }
  }
  c->context.push_back(kEndOfText < options_.vocab_size ? kEndOfText : 0);
  c->context.insert(c->context.end(), ids->begin(), ids->end());
  if (static_cast<int64_t>(c->context.size()) + c->max_tokens > options_.max_seq_len) {
    return Error(
        res, 400,
        absl::StrCat("the prompt's ", ids->size(), " tokens and max_tokens ", c->max_tokens,
                     " exceed the model's context of ", options_.max_seq_len));
  }
  c->id = next_id_++;
  c->arrived_s = MonotonicSeconds();
  if (!queue_->Push(c)) {
    queue_->CountRejected();
    res.set_header("Retry-After", "1");
    if (queue_->closed()) return Error(res, 503, "the server is stopping", "unavailable");
    return Error(res, 429, "the queue is full; retry later", "rate_limit_exceeded");
  }
  // Until the request is done, the client hangs up, or the timeout.
  const double give_up = MonotonicSeconds() + options_.request_timeout_s;
  while (!queue_->WaitDone(c, 0.05)) {
    if (ClientLeft(connection)) {
      c->cancelled = true;
      return;  // nobody to answer
    }
    if (MonotonicSeconds() > give_up) {
      c->cancelled = true;
      return Error(res, 504, "not done within the request timeout (args.request_timeout_s)",
                   "timeout");
    }
  }
  if (!c->error.empty()) {
    res.set_header("Retry-After", "1");
    return Error(res, 503, c->error, "unavailable");
  }
  const int64_t prompt_tokens = static_cast<int64_t>(c->context.size()) - 1;
  const int64_t completion = static_cast<int64_t>(c->generated.size());
  const json out = {{"id", absl::StrCat("cmpl-", c->id)},
         {"object", "text_completion"},
         {"created", static_cast<int64_t>(std::time(nullptr))},
         {"model", options_.model_name},
         {"choices",
          {{{"index", 0},
            {"text", c->text},
            {"finish_reason", "length"},
            {"tokens", c->generated}}}},
         {"usage",
          {{"prompt_tokens", prompt_tokens},
           {"completion_tokens", completion},
           {"total_tokens", prompt_tokens + completion}}},
         {"timings",
          {{"queue_ms", 1e3 * (c->admitted_s - c->arrived_s)},
           {"first_token_ms", 1e3 * (c->first_token_s - c->arrived_s)},
           {"total_ms", 1e3 * (c->done_s - c->arrived_s)}}}};
  res.status = 200;
  res.set_content(out.dump() + "\n", "application/json");
}

}  // namespace freeride::serve
