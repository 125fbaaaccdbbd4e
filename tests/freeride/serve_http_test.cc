// The serve task's HTTP side under hostile clients on 127.0.0.1, with a stand-in for the
// bubbles (a thread that answers each queued request with two tokens): clients that send their
// headers a byte at a time and bursts of 200 connections at once get only answers (200, 429,
// other 4xx), never a reset or silence, and a valid request is served once they are gone; and
// the OpenAI subset over a real socket (streams, errors, models, Prometheus metrics).
// Real time: the server's deadlines are on the clock its clients see. The test asserts no
// duration; its waits are capped far beyond what an idle machine needs (60 s per client).
#include "freeride/tasks/serve_http.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/timer.h"
#include "freeride/tasks/serve_queue.h"
#include "gtest/gtest.h"
#include "models/tokenizer.h"

namespace freeride::serve {
namespace {

constexpr double kClientCapS = 60;  // no answer by then: a hang

// An HttpFront on any free port of 127.0.0.1, whose queued requests a thread finishes (not
// while the bubbles are held: none comes).
class TestServer {
 public:
  explicit TestServer(const HttpOptions& options) : queue_(4) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Load(kDefaultTokenizerPath);
    EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = *std::move(tokenizer);
    HttpHooks hooks;
    hooks.metrics_json = [] { return std::string("{}\n"); };
    hooks.degraded = [] { return std::string(); };
    front_ = std::make_unique<HttpFront>(options, &queue_, tokenizer_.get(), std::move(hooks));
    absl::StatusOr<int> port = front_->Start();
    EXPECT_TRUE(port.ok()) << port.status();
    port_ = port.ok() ? *port : 0;
    bubbles_ = std::thread([this] {
      while (!stop_) {
        queue_.WaitForWork(0.01);
        if (held_) continue;
        for (const std::shared_ptr<Completion>& c : queue_.Take(2)) {
          queue_.Emit(c, 64);  // "a"
          queue_.Emit(c, 65);  // "b"
          c->generated = {64, 65};
          c->text = "ab";
          c->finish_reason = "length";
          queue_.Finish(c, MonotonicSeconds());
        }
      }
    });
  }
  ~TestServer() {
    stop_ = true;
    bubbles_.join();
    queue_.Close("stopped", MonotonicSeconds());
    front_->Stop();
  }
  int port() const { return port_; }
  void HoldBubbles(bool held) { held_ = held; }

 private:
  Queue queue_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<HttpFront> front_;
  int port_ = 0;
  std::atomic<bool> stop_{false}, held_{false};
  std::thread bubbles_;
};

// What a client got: an HTTP status, or 0 and why not.
struct Outcome {
  int status = 0;
  std::string why;
};

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval cap{static_cast<time_t>(kClientCapS), 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &cap, sizeof(cap));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &cap, sizeof(cap));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Reads the answer until the server closes; the status from its first line. Bytes already
// received are read before a reset is reported, so an answer followed by a reset counts.
Outcome ReadAnswer(int fd) {
  std::string got;
  char buffer[4096];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) got.append(buffer, static_cast<size_t>(n));
  const int error = n < 0 ? errno : 0;
  close(fd);
  int status = 0;
  if (got.rfind("HTTP/1.1 ", 0) == 0 && std::sscanf(got.c_str() + 9, "%d", &status) == 1) {
    return {status, ""};
  }
  if (error == EAGAIN || error == EWOULDBLOCK) return {0, "no answer within 60 s"};
  return {0, error != 0 ? std::string("reset without an answer: ") + std::strerror(error)
                        : "closed without an answer"};
}

Outcome Post(int port, const std::string& body) {
  const int fd = Connect(port);
  if (fd < 0) return {0, std::string("connect: ") + std::strerror(errno)};
  const std::string request =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\n\r\n" + body;
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) < 0 && errno != EPIPE &&
      errno != ECONNRESET) {
    close(fd);
    return {0, std::string("send: ") + std::strerror(errno)};
  }
  return ReadAnswer(fd);
}

// Sends a request's headers one byte every `byte_every_s`, never ending them, until the server
// answers or closes; counts itself in `connected` once connected.
Outcome SlowLoris(int port, double byte_every_s, std::atomic<int>* connected) {
  const int fd = Connect(port);
  ++*connected;
  if (fd < 0) return {0, std::string("connect: ") + std::strerror(errno)};
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ";
  const double give_up = MonotonicSeconds() + kClientCapS;
  for (size_t i = 0; MonotonicSeconds() < give_up; ++i) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(byte_every_s * 1e3)) > 0) return ReadAnswer(fd);
    const char byte = i < head.size() ? head[i] : 'a';
    if (send(fd, &byte, 1, MSG_NOSIGNAL) != 1) return ReadAnswer(fd);  // the answer came first
  }
  close(fd);
  return {0, "no answer within 60 s"};
}

TEST(ServeHttpTest, SlowAndBurstingClientsGetAnswersAndServingResumes) {
  HttpOptions options;
  options.port = 0;
  options.threads = 8;
  options.waiting_limit = 6;  // a queue of 4 and 2 decoding slots
  options.read_timeout_s = 1.5;
  options.request_timeout_s = 60;
  options.vocab_size = 50257;
  options.max_seq_len = 64;
  options.max_tokens_limit = 8;
  TestServer server(options);
  ASSERT_GT(server.port(), 0);
  const std::string valid = R"({"prompt": "And", "max_tokens": 2})";

  // 40 slow clients (more than the pool's 14 threads), then, once they are connected, 200
  // valid requests at once; then 200 valid requests alone.
  std::vector<Outcome> slow(40), burst(200), alone(200);
  std::vector<std::thread> clients;
  std::atomic<int> connected{0};
  for (Outcome& o : slow) {
    clients.emplace_back(
        [&o, &server, &connected] { o = SlowLoris(server.port(), 0.25, &connected); });
  }
  const double give_up = MonotonicSeconds() + kClientCapS;
  while (connected < static_cast<int>(slow.size()) && MonotonicSeconds() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (Outcome& o : burst) {
    clients.emplace_back([&o, &server, &valid] { o = Post(server.port(), valid); });
  }
  for (std::thread& t : clients) t.join();
  clients.clear();
  for (Outcome& o : alone) {
    clients.emplace_back([&o, &server, &valid] { o = Post(server.port(), valid); });
  }
  for (std::thread& t : clients) t.join();

  auto count = [](const char* what, const std::vector<Outcome>& outcomes) {
    std::map<int, int> codes;
    for (const Outcome& o : outcomes) ++codes[o.status];
    for (const auto& [code, n] : codes) std::printf("%s: %d x %d\n", what, n, code);
    return codes;
  };
  for (const Outcome& o : slow) {
    EXPECT_TRUE(o.status == 408 || o.status == 429) << o.status << " " << o.why;
  }
  for (const std::vector<Outcome>* outcomes : {&burst, &alone}) {
    for (const Outcome& o : *outcomes) {
      EXPECT_TRUE(o.status == 200 || (o.status >= 400 && o.status < 500))
          << o.status << " " << o.why;
    }
  }
  // The slow clients that a thread took were cut off by the request deadline.
  EXPECT_GT(count("slow clients", slow)[408], 0);
  count("burst beside them", burst);
  // Alone, the burst finds free threads: the first requests are served.
  EXPECT_GT(count("burst alone", alone)[200], 0);

  // Gone: a valid request is served. (Retried on a 4xx, at most 10 times: a thread of this
  // process descheduled between its connect and its send past read_timeout_s is answered 408.)
  Outcome after;
  for (int i = 0; i < 10 && after.status != 200; ++i) after = Post(server.port(), valid);
  EXPECT_EQ(after.status, 200) << after.why;
}

TEST(ServeHttpTest, AClientThatNeverSendsIsAnswered408) {
  HttpOptions options;
  options.port = 0;
  options.read_timeout_s = 0.5;
  options.vocab_size = 50257;
  options.max_seq_len = 64;
  TestServer server(options);
  ASSERT_GT(server.port(), 0);
  const int fd = Connect(server.port());
  ASSERT_GE(fd, 0);
  EXPECT_EQ(ReadAnswer(fd).status, 408);
}

// The OpenAI subset over a real socket, with httplib's own client: a streamed completion is
// server-sent events ending with [DONE], whose texts make the answer; unknown routes and
// models are 404s in OpenAI's error shape; /v1/models names the model; /metrics is Prometheus
// text that counted them.
TEST(ServeHttpTest, SpeaksOpenAiStreamsModelsErrorsAndPrometheus) {
  HttpOptions options;
  options.port = 0;
  options.vocab_size = 50257;
  options.max_seq_len = 64;
  options.model_name = "step_00000010";
  options.slots = 2;
  TestServer server(options);
  ASSERT_GT(server.port(), 0);
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(static_cast<time_t>(kClientCapS), 0);

  const httplib::Result streamed = client.Post(
      "/v1/completions", R"({"prompt": "And", "max_tokens": 2, "stream": true})",
      "application/json");
  ASSERT_TRUE(streamed) << httplib::to_string(streamed.error());
  EXPECT_EQ(streamed->status, 200);
  EXPECT_EQ(streamed->get_header_value("Content-Type"), "text/event-stream");
  std::vector<std::string> events;
  for (size_t at = 0, end; (end = streamed->body.find("\n\n", at)) != std::string::npos;
       at = end + 2) {
    events.push_back(streamed->body.substr(at, end - at));
  }
  ASSERT_GE(events.size(), 2u) << streamed->body;
  EXPECT_EQ(events.back(), "data: [DONE]");
  std::string text, finish;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    ASSERT_EQ(events[i].rfind("data: ", 0), 0u) << events[i];
    const nlohmann::json chunk = nlohmann::json::parse(events[i].substr(6));
    EXPECT_EQ(chunk["object"], "text_completion");
    EXPECT_EQ(chunk["model"], "step_00000010");
    text += chunk["choices"][0]["text"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null()) finish = chunk["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, "ab");
  EXPECT_EQ(finish, "length");

  const httplib::Result plain =
      client.Post("/v1/completions", R"({"prompt": ["And", "Or"], "max_tokens": 2})",
                  "application/json");
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->status, 200);
  EXPECT_EQ(plain->body.front(), '{');  // nothing before the JSON
  const nlohmann::json answer = nlohmann::json::parse(plain->body);
  ASSERT_EQ(answer["choices"].size(), 2u);
  EXPECT_EQ(answer["choices"][1]["index"], 1);
  EXPECT_EQ(answer["usage"]["completion_tokens"], 4);

  const httplib::Result unknown = client.Get("/v1/embeddings");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  EXPECT_EQ(nlohmann::json::parse(unknown->body)["error"]["code"], "unknown_url");
  const httplib::Result model = client.Post(
      "/v1/completions", R"({"prompt": "And", "model": "gpt-4"})", "application/json");
  ASSERT_TRUE(model);
  EXPECT_EQ(model->status, 404);
  EXPECT_EQ(nlohmann::json::parse(model->body)["error"]["param"], "model");
  const httplib::Result models = client.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(nlohmann::json::parse(models->body)["data"][0]["id"], "step_00000010");

  // Counted once written (a server thread may count its answer after the client read it):
  // polled, up to the client cap.
  const std::vector<std::string> wanted = {
      "freeride_serve_requests_total{route=\"other\",status=\"404\"} 1\n",
      "freeride_serve_requests_total{route=\"/v1/completions\",status=\"200\"} 2\n",
      "freeride_serve_requests_total{route=\"/v1/completions\",status=\"404\"} 1\n",
      "freeride_serve_completion_tokens_total 6\n", "freeride_serve_slots 2\n"};
  auto missing = [&wanted](const std::string& text) {
    for (const std::string& line : wanted) {
      if (text.find(line) == std::string::npos) return line;
    }
    return std::string();
  };
  std::string text_metrics;
  for (const double give_up = MonotonicSeconds() + kClientCapS;
       !missing(text_metrics).empty() && MonotonicSeconds() < give_up;) {
    const httplib::Result metrics = client.Get("/metrics");
    ASSERT_TRUE(metrics);
    EXPECT_EQ(metrics->get_header_value("Content-Type"),
              "text/plain; version=0.0.4; charset=utf-8");
    text_metrics = metrics->body;
  }
  EXPECT_EQ(missing(text_metrics), "") << text_metrics;
}

// A stream waiting for a bubble sends SSE comment lines, and only those, until its tokens come:
// the bubbles are held until the client has read a keep-alive line.
TEST(ServeHttpTest, AStreamWaitingForBubblesSendsCommentLinesNotPadding) {
  HttpOptions options;
  options.port = 0;
  options.vocab_size = 50257;
  options.max_seq_len = 64;
  options.keep_alive_s = 0.05;
  TestServer server(options);
  ASSERT_GT(server.port(), 0);
  server.HoldBubbles(true);
  const int fd = Connect(server.port());
  ASSERT_GE(fd, 0);
  const std::string body = R"({"prompt": "And", "max_tokens": 2, "stream": true})";
  const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  std::string got;
  char buffer[4096];
  ssize_t n;
  while (got.find(kSseKeepAlive) == std::string::npos &&
         (n = recv(fd, buffer, sizeof(buffer), 0)) > 0) {
    got.append(buffer, static_cast<size_t>(n));
  }
  const size_t head_end = got.find("\r\n\r\n");
  ASSERT_NE(head_end, std::string::npos) << got;
  EXPECT_NE(got.find("Content-Type: text/event-stream"), std::string::npos) << got;
  EXPECT_NE(got.find(kSseKeepAlive, head_end), std::string::npos) << got;
  EXPECT_EQ(got.find("data: "), std::string::npos) << got;  // nothing but comments yet
  EXPECT_EQ(got.find("  "), std::string::npos) << got;      // and no padding
  server.HoldBubbles(false);
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) got.append(buffer, static_cast<size_t>(n));
  close(fd);
  std::string text;  // the events' texts, read through the chunked framing
  for (size_t at = 0, end; (end = got.find('\n', at)) != std::string::npos; at = end + 1) {
    if (got.compare(at, 7, "data: {") == 0) {
      text += nlohmann::json::parse(got.substr(at + 6, end - at - 6))["choices"][0]["text"];
    }
  }
  EXPECT_EQ(text, "ab") << got;
  EXPECT_NE(got.find("data: [DONE]\n\n"), std::string::npos) << got;
}

}  // namespace
}  // namespace freeride::serve
