// `serve`: LLM completions over HTTP, computed in the training's bubbles. The network side
// (serve_http.cc) only queues requests; each bubble step admits waiting requests into up to
// args.max_batch decoding slots (the CPU decoder with a key/value cache, one per slot, in the
// task's arena) and advances every slot by one position, prefill or decode, round after round
// while the measured round time still fits before the bubble's deadline. Tokens are drawn as
// `freeride sample` draws them (models/sampling.h), so a request's text equals sample's for the
// same checkpoint, prompt and seed. Unloaded and loaded again (preemption), a slot replays its
// prompt and the tokens it had made, without drawing: the text does not change. A request ends
// at max_tokens ("length") or where one of its stop sequences appears in its text ("stop": the
// text is cut before it). A step that finds no request only waits for one: it says so
// (ctx.idle), and the report does not count that time as harvested.
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/strings/str_format.h"
#include "core/clock.h"
#include "core/status.h"
#include "core/timer.h"
#include "freeride/side_task.h"
#include "freeride/tasks/serve_http.h"
#include "freeride/tasks/serve_openai.h"
#include "freeride/tasks/serve_queue.h"
#include "models/checkpoint_verify.h"
#include "models/kv_decoder.h"
#include "models/llmc_checkpoint.h"
#include "models/sampling.h"
#include "models/tokenizer.h"

namespace freeride {
namespace {

using serve::Completion;

struct Slot {
  std::unique_ptr<KvDecoder<float>> decoder;
  std::shared_ptr<Completion> request;  // null: free
  std::optional<TokenSampler> sampler;
  size_t fed = 0;                 // positions of context + generated fed to the decoder
  const float* logits = nullptr;  // after the last position fed
};

class ServeTask : public SideTask {
 public:
  ~ServeTask() override {
    if (queue_)
      queue_->Close("the serve task stopped (training ended or the task failed)",
                    MonotonicSeconds());
    for (Slot& s : slots_) {
      if (s.request && queue_)
        queue_->Finish(s.request, MonotonicSeconds(), "the serve task stopped");
    }
    if (front_) front_->Stop();
  }

  absl::Status Create(SideTaskContext& ctx) override {
    ArgReader args(ctx.name, *ctx.args);
    FR_RETURN_IF_ERROR(args.OnlyKnown({"checkpoint", "tokenizer", "host", "port", "allow_remote",
                                       "max_batch", "max_queue", "max_tokens", "request_timeout_s",
                                       "threads", "read_timeout_s", "target_ttft_ms"}));
    auto path = args.String("checkpoint", "");
    auto tokenizer = args.String("tokenizer", kDefaultTokenizerPath);
    auto host = args.String("host", "127.0.0.1");
    auto port = args.Int("port", serve::kDefaultPort, 0, 65535);
    auto remote = args.Bool("allow_remote", false);
    auto batch = args.Int("max_batch", 4, 1, 256);
    auto queue = args.Int("max_queue", 32, 1, 1 << 20);
    auto limit = args.Int("max_tokens", 256, 1, 1 << 20);
    auto timeout = args.Number("request_timeout_s", 120, 0.1, 86400);
    auto threads = args.Int("threads", 16, 2, 1024);
    auto read_timeout = args.Number("read_timeout_s", 5, 0.1, 3600);
    auto target = args.Number("target_ttft_ms", 0, 0, 3.6e6);  // 0: none
    for (const absl::Status& s :
         {path.status(), tokenizer.status(), host.status(), port.status(), remote.status(),
          batch.status(), queue.status(), limit.status(), timeout.status(), threads.status(),
          read_timeout.status(), target.status()}) {
      FR_RETURN_IF_ERROR(s);
    }
    if (path->empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "side task '%s': args.checkpoint is required (an llm.c model file)", ctx.name));
    }
    if (!serve::IsLoopback(*host) && !*remote) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "side task '%s': args.host = \"%s\" is reachable from other machines; set "
          "args.allow_remote = true to serve there, or keep the default 127.0.0.1",
          ctx.name, *host));
    }
    FR_ASSIGN_OR_RETURN(config_, ReadLlmcModelConfig(*path));
    absl::StatusOr<std::unique_ptr<Tokenizer>> loaded = Tokenizer::Load(*tokenizer);
    if (!loaded.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("side task '%s': args.tokenizer = \"%s\": %s", ctx.name, *tokenizer,
                          loaded.status().message()));
    }
    tokenizer_ = *std::move(loaded);
    path_ = *path, max_batch_ = *batch;
    // Made here rather than with the server at Load: HasPendingWork reads it from the training
    // thread, which Create happens before.
    queue_ = std::make_unique<serve::Queue>(*queue, *target);
    http_.host = *host, http_.port = static_cast<int>(*port), http_.max_tokens_limit = *limit;
    http_.request_timeout_s = *timeout, http_.threads = static_cast<int>(*threads);
    http_.waiting_limit = *queue + *batch, http_.read_timeout_s = *read_timeout;
    http_.vocab_size = config_.vocab_size, http_.max_seq_len = config_.max_seq_len;
    http_.slots = *batch;
    // The checkpoint's directory names it (runs write .../step_00000010/model.bin).
    const std::filesystem::path checkpoint(*path);
    http_.model_name = checkpoint.filename() == "model.bin" && checkpoint.has_parent_path()
                           ? checkpoint.parent_path().filename().string()
                           : checkpoint.filename().string();
    return absl::OkStatus();
  }

  absl::Status Load(SideTaskContext& ctx) override {
    // A checkpoint's model.bin is checked against its manifest each time it is read: a corrupt
    // one fails the task, by name (training goes on), instead of serving wrong numbers.
    FR_RETURN_IF_ERROR(VerifyModelFile(path_));
    FR_ASSIGN_OR_RETURN(LlmcModel model, ReadLlmcModel(path_));
    FR_ASSIGN_OR_RETURN(float* weights,
                        ctx.arena->AllocateArray<float>(static_cast<int64_t>(model.params.size()),
                                                        "serve weights"));
    std::copy(model.params.begin(), model.params.end(), weights);
    const int64_t len = config_.max_seq_len;
    slots_.resize(static_cast<size_t>(max_batch_));
    for (Slot& slot : slots_) {
      FR_ASSIGN_OR_RETURN(float* workspace,
                          ctx.arena->AllocateArray<float>(KvDecoderWorkspaceFloats(config_, 1, len),
                                                          "serve KV cache"));
      FR_ASSIGN_OR_RETURN(slot.decoder, MakeKvDecoder<float>(config_, weights, 1, len, workspace));
      slot.fed = 0;  // a request in the slot replays what it had
    }
    if (!front_) FR_RETURN_IF_ERROR(StartServer(ctx));
    return absl::OkStatus();
  }

  absl::StatusOr<double> Step(SideTaskContext& ctx) override {
    // The bubble's deadline is on the task's clock; requests (and /health's last step) are
    // timed on real time, as their clients see it.
    Clock& clock = ClockOr(ctx.clock);
    const double start = clock.Now();
    last_step_s_ = MonotonicSeconds();
    Admit(last_step_s_);
    if (Active() == 0) {
      queue_->WaitForWork(std::clamp(ctx.deadline_s - start, 0.0, 0.002));
      ctx.idle = true;
      return 0.0;
    }
    double units = 0;
    do {
      const double round_start = clock.Now();
      for (Slot& slot : slots_) units += Advance(slot);
      const double round = clock.Now() - round_start;
      round_s_ = round_s_ == 0 ? round : 0.8 * round_s_ + 0.2 * round;
      Admit(MonotonicSeconds());
    } while (Active() > 0 && clock.Now() + round_s_ < ctx.deadline_s);
    busy_s_.store(busy_s_.load() + clock.Now() - start);
    return units;
  }

  absl::Status Unload(SideTaskContext&) override {
    for (Slot& slot : slots_) slot.decoder.reset(), slot.logits = nullptr;
    return absl::OkStatus();
  }

  std::string UnitName() const override { return "tokens"; }
  bool LatencySensitive() const override { return true; }
  bool HasPendingWork() const override {
    return active_.load() > 0 || (queue_ && queue_->any_waiting());
  }
  std::string Summary() const override {
    const serve::Queue::Stats s = queue_ ? queue_->stats() : serve::Queue::Stats{};
    const std::string target = s.target_ttft_ms > 0
                                   ? absl::StrFormat(" (target %.0f ms: met by %d, missed by %d)",
                                                     s.target_ttft_ms, s.ttft_met, s.ttft_missed)
                                   : "";
    return absl::StrFormat(
        "%s: %d requests served (%d choices; %d rejected, %d cancelled), %d tokens; latency ms "
        "p50/p95/p99 "
        "%.0f/%.0f/%.0f, first token %.0f/%.0f/%.0f%s; %.1f tokens/s in bubbles, %.1f alone "
        "(one sequence)",
        address_, s.responses, s.choices, s.rejected, s.cancelled, s.tokens, s.latency_ms.p50,
        s.latency_ms.p95, s.latency_ms.p99, s.first_token_ms.p50, s.first_token_ms.p95,
        s.first_token_ms.p99, target,
        busy_s_.load() > 0 ? static_cast<double>(generated_.load()) / busy_s_.load() : 0.0,
        alone_tokens_per_s_.load());
  }

 private:
  absl::Status StartServer(SideTaskContext& ctx) {
    last_step_s_ = MonotonicSeconds();
    serve::HttpHooks hooks;
    hooks.metrics_json = [this] { return MetricsJson(); };
    hooks.degraded = [this] { return Degraded(); };
    hooks.active_slots = [this] { return static_cast<int64_t>(active_.load()); };
    front_ =
        std::make_unique<serve::HttpFront>(http_, queue_.get(), tokenizer_.get(), std::move(hooks));
    absl::StatusOr<int> port = front_->Start();
    if (!port.ok()) {
      return absl::UnavailableError(
          absl::StrFormat("side task '%s': %s", ctx.name, port.status().message()));
    }
    address_ = absl::StrFormat("http://%s:%d", http_.host, *port);
    std::ofstream(ctx.results_dir + "/address") << address_ << "\n";
    // The engine alone, for the report: one sequence decoding 16 positions.
    KvDecoder<float>& d = *slots_[0].decoder;
    const int32_t token =
        static_cast<int32_t>(std::min<int64_t>(kEndOfText, config_.vocab_size - 1));
    const double t0 = MonotonicSeconds();
    int fed = 0;  // fewer where the context is shorter than 16
    for (; fed < 16 && d.position() < d.max_len(); ++fed)
      FR_RETURN_IF_ERROR(d.Step(&token).status());
    alone_tokens_per_s_ = fed / std::max(1e-9, MonotonicSeconds() - t0);
    d.Reset();
    return absl::OkStatus();
  }

  int Active() const {
    return static_cast<int>(std::count_if(slots_.begin(), slots_.end(),
                                          [](const Slot& s) { return s.request != nullptr; }));
  }

  void Admit(double now_s) {
    const int free = max_batch_ - Active();
    if (free <= 0) return;
    std::vector<std::shared_ptr<Completion>> fresh = queue_->Take(static_cast<size_t>(free));
    size_t next = 0;  // oldest first
    for (Slot& slot : slots_) {
      if (slot.request || next == fresh.size()) continue;
      slot.request = std::move(fresh[next++]);
      slot.request->admitted_s = now_s;
      slot.sampler.emplace(slot.request->temperature, slot.request->top_k, slot.request->seed);
      slot.decoder->Reset();
      slot.fed = 0;
      ++active_;
    }
  }

  // One position of one slot; the tokens it drew (0 or 1).
  double Advance(Slot& slot) {
    if (!slot.request) return 0;
    Completion& c = *slot.request;
    if (c.cancelled) {
      queue_->CountCancelled();
      Release(slot, "cancelled: the client went away");
      return 0;
    }
    if (slot.fed < c.context.size() + c.generated.size()) {  // prefill, or replay after a reload
      const int32_t token = slot.fed < c.context.size() ? c.context[slot.fed]
                                                        : c.generated[slot.fed - c.context.size()];
      Feed(slot, token);
      return 0;
    }
    const int32_t next = slot.sampler->Next(slot.logits, config_.vocab_size);
    c.generated.push_back(next);
    ++generated_;
    if (c.generated.size() == 1) c.first_token_s = MonotonicSeconds();
    const bool full = static_cast<int64_t>(c.generated.size()) >= c.max_tokens;
    if (full || !c.stop.empty()) {
      absl::StatusOr<std::string> text = tokenizer_->Decode(c.generated);
      if (!text.ok()) {
        Release(slot, std::string(text.status().message()));
        return 1;
      }
      const size_t stop = serve::FindStop(*text, c.stop);
      if (full || stop != std::string::npos) {
        c.text = text->substr(0, stop);
        c.finish_reason = stop != std::string::npos ? "stop" : "length";
        Release(slot, "");
        return 1;
      }
    }
    queue_->Emit(slot.request, next);
    Feed(slot, next);
    return 1;
  }

  // One token into the slot's cache; a request that outgrows it ends with the decoder's error.
  void Feed(Slot& slot, int32_t token) {
    absl::StatusOr<const float*> logits = slot.decoder->Step(&token);
    if (!logits.ok()) return Release(slot, std::string(logits.status().message()));
    slot.logits = *logits;
    ++slot.fed;
  }

  // Frees the slot and answers its request (`error` empty: done). The count drops first: a
  // client may read /metrics as soon as it is answered.
  void Release(Slot& slot, const std::string& error) {
    const std::shared_ptr<Completion> request = std::move(slot.request);
    --active_;
    queue_->Finish(request, MonotonicSeconds(), error);
  }

  // Why requests cannot be served now ("" when they can): some wait, and no bubble step has
  // come for kStallS (the task is paused, demoted past every bubble, or training is stuck).
  std::string Degraded() const {
    const double idle = MonotonicSeconds() - last_step_s_.load();
    if (queue_->waiting() + static_cast<size_t>(active_.load()) == 0 || idle <= kStallS) return "";
    return absl::StrFormat("%d requests wait and no bubble has served them for %.1f s",
                           queue_->waiting() + static_cast<size_t>(active_.load()), idle);
  }

  std::string MetricsJson() const {
    const serve::Queue::Stats s = queue_->stats();
    auto p = [](const serve::Percentiles& x) {
      return nlohmann::json{{"p50", x.p50}, {"p95", x.p95}, {"p99", x.p99}};
    };
    return nlohmann::json{
               {"queue", queue_->waiting()},
               {"active", active_.load()},
               {"requests_served", s.responses},
               {"choices_served", s.choices},
               {"requests_rejected", s.rejected},
               {"requests_cancelled", s.cancelled},
               {"tokens_generated", s.tokens},
               {"tokens_per_s_in_bubbles",
                busy_s_.load() > 0 ? static_cast<double>(generated_.load()) / busy_s_.load() : 0.0},
               {"tokens_per_s_alone", alone_tokens_per_s_.load()},
               {"latency_ms", p(s.latency_ms)},
               {"first_token_ms", p(s.first_token_ms)},
               {"target_ttft_ms", s.target_ttft_ms},
               {"ttft_target_met", s.ttft_met},
               {"ttft_target_missed", s.ttft_missed}}
               .dump() +
           "\n";
  }

  std::string path_, address_;
  GPT2Config config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  int max_batch_ = 4;
  serve::HttpOptions http_;
  std::unique_ptr<serve::Queue> queue_;
  std::unique_ptr<serve::HttpFront> front_;
  std::vector<Slot> slots_;
  double round_s_ = 0;
  // Read by the HTTP threads for /metrics: approximate figures are fine there.
  std::atomic<double> busy_s_{0}, alone_tokens_per_s_{0}, last_step_s_{0};
  static constexpr double kStallS = 2.0;
  std::atomic<int64_t> generated_{0};
  std::atomic<int> active_{0};  // slots holding a request
};

}  // namespace

FREERIDE_REGISTER_SIDE_TASK(ServeTask, "serve");

}  // namespace freeride
