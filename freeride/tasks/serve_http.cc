#include "freeride/tasks/serve_http.h"

#include <httplib.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "core/timer.h"
#include "freeride/tasks/serve_connections.h"

namespace freeride::serve {
namespace {

using nlohmann::json;

void Reply(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(ErrorBody(e), "application/json");
}

ApiError Unavailable(const std::string& message) {
  return {503, message, "server_error", "", "unavailable"};
}

// Whether the client hung up (or reset) the connection.
bool ClientLeft(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

void CancelAll(const std::vector<std::shared_ptr<Completion>>& cs) {
  for (const auto& c : cs) c->cancelled = true;
}

// The route a request is counted under in /metrics: one of ours, or "other" (unknown paths
// must not grow the label set without end).
std::string RouteLabel(const std::string& path) {
  for (const char* route :
       {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"}) {
    if (path == route) return route;
  }
  return path.rfind("/v1/models/", 0) == 0 ? "/v1/models/{id}" : "other";
}

}  // namespace

// One streamed request: its choices and what has been sent of each.
struct StreamState {
  Endpoint endpoint = Endpoint::kCompletions;
  ResponseMeta meta;
  std::vector<std::shared_ptr<Completion>> cs;
  std::vector<DeltaStream> deltas;
  std::vector<bool> finished;
  int64_t prompt_tokens = 0;
  bool include_usage = false;
  double give_up = 0;
  int connection = -1;  // its socket, watched for the client hanging up
};

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

HttpFront::HttpFront(HttpOptions options, Queue* queue, Tokenizer* tokenizer, HttpHooks hooks)
    : options_(std::move(options)),
      queue_(queue),
      tokenizer_(tokenizer),
      hooks_(std::move(hooks)),
      started_(static_cast<int64_t>(std::time(nullptr))),
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
  Routes(s);
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

void HttpFront::Routes(httplib::Server& s) {
  // cpp-httplib's own answers (400 for a malformed request, 404, 413) come once the request is
  // read: the pool's deadline is over for them too. They get OpenAI's error shape; the
  // handlers' own errors have their bodies already.
  s.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        ConnectionPool::EnterHandler();
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        const std::string message =
            res.status == 404 ? absl::StrCat("Invalid URL (", req.method, " ", req.path,
                                             "): see docs/serve.md for the routes")
                              : absl::StrCat("the request was refused (HTTP ", res.status, ")");
        res.set_content(ErrorBody({res.status, message, "invalid_request_error", "",
                                   res.status == 404 ? "unknown_url" : ""}),
                        "application/json");
        return httplib::Server::HandlerResponse::Handled;
      }));
  // Every answer, once written (a stream's at its end), counted by route and status.
  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics_.CountRequest(RouteLabel(req.path), res.status);
  });
  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Completions(Endpoint::kCompletions, req, res);
  });
  s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Completions(Endpoint::kChat, req, res);
  });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    ConnectionPool::EnterHandler();
    res.set_content(Dump(ModelsJson(options_.model_name, started_)) + "\n", "application/json");
  });
  s.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    ConnectionPool::EnterHandler();
    if (req.matches[1] != options_.model_name) {
      return Reply(res, {404, absl::StrCat("The model '", req.matches[1].str(), "' does not exist"),
                         "invalid_request_error", "model", "model_not_found"});
    }
    res.set_content(Dump(ModelsJson(options_.model_name, started_)["data"][0]) + "\n",
                    "application/json");
  });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    ConnectionPool::EnterHandler();
    if (queue_->closed()) {
      res.status = 503;
      res.set_content(json{{"status", "stopped"}}.dump() + "\n", "application/json");
      return;
    }
    const std::string why = hooks_.degraded();
    res.status = why.empty() ? 200 : 503;
    json body{{"status", why.empty() ? "ok" : "degraded"}};
    if (!why.empty()) body["reason"] = why;
    res.set_content(body.dump() + "\n", "application/json");
  });
  s.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
    ConnectionPool::EnterHandler();
    if (req.get_param_value("format") == "json") {
      return res.set_content(hooks_.metrics_json(), "application/json");
    }
    const Queue::Stats stats = queue_->stats();
    Gauges g;
    g.queue = static_cast<int64_t>(queue_->waiting());
    g.active_slots = hooks_.active_slots ? hooks_.active_slots() : 0;
    g.slots = options_.slots;
    g.rejected = stats.rejected, g.cancelled = stats.cancelled;
    g.target_ttft_ms = stats.target_ttft_ms;
    g.ttft_met = stats.ttft_met, g.ttft_missed = stats.ttft_missed;
    res.set_content(metrics_.Prometheus(g), "text/plain; version=0.0.4; charset=utf-8");
  });
}

void HttpFront::Stop() {
  if (server_) server_->stop();
  if (listener_.joinable()) listener_.join();
}

void HttpFront::CountDone(const Completion& c) {
  metrics_.AddTokens(0, static_cast<int64_t>(c.generated.size()));
  metrics_.ObserveLatency(c.first_token_s - c.arrived_s, c.done_s - c.arrived_s);
}

void HttpFront::Completions(Endpoint endpoint, const httplib::Request& req,
                            httplib::Response& res) {
  const int connection = ConnectionPool::EnterHandler();
  ParsedRequest r;
  const ParseLimits limits{options_.max_tokens_limit, options_.model_name};
  if (std::optional<ApiError> e = ParseRequest(endpoint, req.body, limits, &r)) {
    return Reply(res, *e);
  }
  const std::string field = endpoint == Endpoint::kChat ? "messages" : "prompt";
  std::vector<std::shared_ptr<Completion>> cs;
  int64_t prompt_tokens = 0;
  for (const std::string& prompt : r.prompts) {
    absl::StatusOr<std::vector<int32_t>> ids;
    {
      std::lock_guard<std::mutex> lock(encode_mu_);
      ids = tokenizer_->Encode(prompt);
    }
    if (!ids.ok()) {
      return Reply(res,
                   {400, std::string(ids.status().message()), "invalid_request_error", field, ""});
    }
    for (int32_t id : *ids) {
      if (id >= options_.vocab_size) {
        return Reply(res, {400,
                           absl::StrCat("the prompt has token ", id, ", outside this model's ",
                                        options_.vocab_size, "-token vocabulary"),
                           "invalid_request_error", field, ""});
      }
    }
    std::vector<int32_t> context = {kEndOfText < options_.vocab_size ? kEndOfText : 0};
    context.insert(context.end(), ids->begin(), ids->end());
    const auto room = options_.max_seq_len - static_cast<int64_t>(context.size());
    const int64_t max_tokens =
        r.max_tokens >= 0 ? r.max_tokens : std::min(options_.max_tokens_limit, room);
    if (max_tokens < 1 || max_tokens > room) {
      return Reply(res, {400,
                         absl::StrCat("the prompt's ", ids->size(), " tokens and max_tokens ",
                                      std::max<int64_t>(max_tokens, 1),
                                      " exceed the model's context of ", options_.max_seq_len),
                         "invalid_request_error", field, "context_length_exceeded"});
    }
    prompt_tokens += static_cast<int64_t>(ids->size());
    for (int64_t j = 0; j < r.n; ++j) {
      auto c = std::make_shared<Completion>();
      c->prompt = prompt;
      c->context = context;
      c->max_tokens = max_tokens;
      c->temperature = r.temperature;
      c->top_k = r.top_k;
      c->seed = r.seed + static_cast<uint64_t>(j);  // n draws of one prompt differ
      c->stop = r.stop;
      c->id = next_id_++;
      c->arrived_s = MonotonicSeconds();
      cs.push_back(std::move(c));
    }
  }
  if (!queue_->PushAll(cs)) {
    queue_->CountRejected();
    if (queue_->closed()) return Reply(res, Unavailable("the server is stopping"));
    return Reply(res, {429, "the queue is full; retry later", "rate_limit_exceeded", "",
                       "rate_limit_exceeded"});
  }
  metrics_.AddTokens(prompt_tokens, 0);
  if (!r.stream) {
    // Until every choice is done, the client hangs up, or the timeout.
    const double give_up = MonotonicSeconds() + options_.request_timeout_s;
    int64_t seen = 0;
    for (size_t done = 0; done < cs.size();) {
      seen = queue_->WaitChange(cs, seen, 0.05);
      done = static_cast<size_t>(std::count_if(
          cs.begin(), cs.end(), [this](const auto& c) { return queue_->Snapshot(c).done; }));
      if (done == cs.size()) break;
      if (ClientLeft(connection)) return CancelAll(cs);  // nobody to answer
      if (MonotonicSeconds() > give_up) {
        CancelAll(cs);
        return Reply(res, {504, "not done within the request timeout (args.request_timeout_s)",
                           "server_error", "", "timeout"});
      }
    }
    return Answer(endpoint, cs, prompt_tokens, res);
  }
  auto state = std::make_shared<StreamState>();
  state->endpoint = endpoint;
  state->meta = {endpoint,
                 absl::StrCat(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-", cs[0]->id),
                 options_.model_name, static_cast<int64_t>(std::time(nullptr))};
  state->cs = cs;
  for (size_t i = 0; i < cs.size(); ++i) {
    state->deltas.emplace_back(r.stop, endpoint == Endpoint::kChat);
  }
  state->finished.assign(cs.size(), false);
  state->prompt_tokens = prompt_tokens;
  state->include_usage = r.include_usage;
  state->give_up = MonotonicSeconds() + options_.request_timeout_s;
  state->connection = connection;
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream", [this, state](size_t, httplib::DataSink& sink) {
        if (!Stream(*state, sink)) {
          CancelAll(state->cs);
          return false;  // the connection is dropped: nobody reads it, or it broke
        }
        sink.done();
        return true;
      });
}

bool HttpFront::Stream(StreamState& st, httplib::DataSink& sink) {
  double last_write = MonotonicSeconds();
  auto send = [&](const std::string& text) {
    last_write = MonotonicSeconds();
    return sink.write(text.data(), text.size());
  };
  if (st.endpoint == Endpoint::kChat) {  // the assistant's role first, as OpenAI sends it
    for (size_t i = 0; i < st.cs.size(); ++i) {
      if (!send(SseData(ChunkJson(st.meta, static_cast<int64_t>(i), "", "", true)))) return false;
    }
  }
  int64_t seen = 0, completion_tokens = 0;
  for (size_t finished = 0; finished < st.cs.size();) {
    seen = queue_->WaitChange(st.cs, seen, 0.05);
    if (ClientLeft(st.connection)) return false;
    for (size_t i = 0; i < st.cs.size(); ++i) {
      if (st.finished[i]) continue;
      const Completion& c = *st.cs[i];
      const Queue::Progress p = queue_->Snapshot(st.cs[i]);
      const auto index = static_cast<int64_t>(i);
      if (p.done && !c.error.empty()) {
        return send(SseData(json::parse(ErrorBody(Unavailable(c.error)))));
      }
      std::string delta;
      if (p.done) {
        delta = st.deltas[i].Finish(c.text);
      } else {
        absl::StatusOr<std::string> text = tokenizer_->Decode(p.tokens);
        if (text.ok()) delta = st.deltas[i].Next(*text);
      }
      if (p.done) {
        st.finished[i] = true;
        ++finished;
        completion_tokens += static_cast<int64_t>(c.generated.size());
        CountDone(c);
        if (!send(SseData(ChunkJson(st.meta, index, delta, c.finish_reason, false)))) return false;
      } else if (!delta.empty() && !send(SseData(ChunkJson(st.meta, index, delta, "", false)))) {
        return false;
      }
    }
    if (finished == st.cs.size()) break;
    const double now = MonotonicSeconds();
    if (now > st.give_up) {
      return send(SseData(json::parse(
          ErrorBody({504, "not done within the request timeout (args.request_timeout_s)",
                     "server_error", "", "timeout"}))));
    }
    // Waiting for a bubble: a comment line keeps proxies and clients from timing out, and
    // tells a client that left (the write fails).
    if (now - last_write > options_.keep_alive_s && !send(kSseKeepAlive)) return false;
  }
  if (st.include_usage &&
      !send(SseData(UsageChunkJson(st.meta, st.prompt_tokens, completion_tokens)))) {
    return false;
  }
  return send(kSseDone);
}

void HttpFront::Answer(Endpoint endpoint, const std::vector<std::shared_ptr<Completion>>& cs,
                       int64_t prompt_tokens, httplib::Response& res) {
  std::vector<ChoiceResult> choices;
  int64_t completion_tokens = 0;
  double queue_ms = 0, first_token_ms = 0, total_ms = 0;
  for (const std::shared_ptr<Completion>& c : cs) {
    if (!c->error.empty()) return Reply(res, Unavailable(c->error));
    choices.push_back({ChoiceText(endpoint, c->text), c->finish_reason, c->generated});
    completion_tokens += static_cast<int64_t>(c->generated.size());
    queue_ms = std::max(queue_ms, 1e3 * (c->admitted_s - c->arrived_s));
    first_token_ms = std::max(first_token_ms, 1e3 * (c->first_token_s - c->arrived_s));
    total_ms = std::max(total_ms, 1e3 * (c->done_s - c->arrived_s));
    CountDone(*c);
  }
  const ResponseMeta meta{
      endpoint, absl::StrCat(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-", cs[0]->id),
      options_.model_name, static_cast<int64_t>(std::time(nullptr))};
  json out = ResponseJson(meta, choices, prompt_tokens, completion_tokens);
  // An extension (the bench reads it): the slowest choice's times, in milliseconds.
  out["timings"] = {
      {"queue_ms", queue_ms}, {"first_token_ms", first_token_ms}, {"total_ms", total_ms}};
  res.status = 200;
  res.set_content(Dump(out) + "\n", "application/json");
}

}  // namespace freeride::serve
