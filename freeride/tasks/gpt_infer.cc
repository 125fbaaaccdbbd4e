// `gpt_infer`: LLM inference in bubbles. Batched generation from a checkpoint of either family
// (GPT-2 or Llama: an llm.c model file, args.checkpoint, whose header says which): a step decodes
// one token for each of args.batch sequences; after args.max_tokens a batch is complete, its token
// ids are appended to results_dir/generations.txt, and with the GPT-2 tokenizer (args.tokenizer,
// default data/r50k_base.tiktoken where it exists) each sequence's ids and decoded text to
// results_dir/generations.jsonl; a new batch starts from <|endoftext|>. args.requests > 0 ends
// the task after that many sequences.
//
// Two engines (args.engine): "kv_cache" (the family's CPU decoder with a key/value cache,
// models/kv_decoder.h; weights, cache and activations in the task's arena) and "recompute" (the
// model on args.device, "cpu" or "cuda", run forward over the whole window each step and read at
// the newest position: work grows with the position, but any backend serves it). "auto": kv_cache
// on the CPU, recompute on a GPU.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/json_string.h"
#include "core/status.h"
#include "freeride/side_task.h"
#include "freeride/tasks/task_model.h"
#include "models/checkpoint_verify.h"
#include "models/kv_decoder.h"
#include "models/llmc_checkpoint.h"
#include "models/sampling.h"
#include "models/tokenizer.h"

namespace freeride {
namespace {

// Next-token logits [batch × Vp] for a batch, one position at a time.
class TokenEngine {
 public:
  virtual ~TokenEngine() = default;
  virtual void Reset() = 0;
  // Feeds each sequence's newest token; the logits of the next position.
  virtual absl::StatusOr<const float*> Step(const int32_t* tokens) = 0;
  virtual int64_t position() const = 0;  // tokens fed since Reset
};

class KvCacheEngine final : public TokenEngine {
 public:
  explicit KvCacheEngine(std::unique_ptr<KvDecoder<float>> decoder)
      : decoder_(std::move(decoder)) {}
  void Reset() override { decoder_->Reset(); }
  absl::StatusOr<const float*> Step(const int32_t* tokens) override {
    return decoder_->Step(tokens);
  }
  int64_t position() const override { return decoder_->position(); }

 private:
  std::unique_ptr<KvDecoder<float>> decoder_;
};

// The whole window [batch × window] through the model each step; positions after the newest
// hold padding, which causal attention keeps from reaching it.
class RecomputeEngine final : public TokenEngine {
 public:
  explicit RecomputeEngine(std::unique_ptr<StageModel> model)
      : model_(std::move(model)),
        B_(model_->micro_batch()),
        W_(model_->seq_len()),
        window_(B_ * W_, 0),
        targets_(B_ * W_, 0),
        logits_(B_ * model_->config().padded_vocab_size) {}
  void Reset() override {
    std::fill(window_.begin(), window_.end(), 0);
    position_ = 0;
  }
  absl::StatusOr<const float*> Step(const int32_t* tokens) override {
    for (int64_t b = 0; b < B_; ++b) window_[b * W_ + position_] = tokens[b];
    FR_RETURN_IF_ERROR(model_->SetTokens(0, window_.data()));
    FR_RETURN_IF_ERROR(model_->SetTargets(0, targets_.data()));
    absl::StatusOr<double> loss = model_->Forward(0);
    if (!loss.ok()) return loss.status();
    FR_RETURN_IF_ERROR(model_->GetLogitsAt(0, position_, logits_.data()));
    ++position_;
    return logits_.data();
  }
  int64_t position() const override { return position_; }

 private:
  std::unique_ptr<StageModel> model_;
  int64_t B_, W_, position_ = 0;
  std::vector<int32_t> window_, targets_;
  std::vector<float> logits_;
};

class GptInferTask : public SideTask {
 public:
  absl::Status Create(SideTaskContext& ctx) override {
    ArgReader args(ctx.name, *ctx.args);
    if (absl::Status s = args.OnlyKnown({"checkpoint", "batch", "max_tokens", "requests",
                                         "temperature", "top_k", "seed", "engine", "device",
                                         "precision", "tokenizer"});
        !s.ok()) {
      return s;
    }
    auto path = args.String("checkpoint", "");
    auto batch = args.Int("batch", 4, 1, 4096);
    auto tokens = args.Int("max_tokens", 64, 1, 1 << 20);
    auto requests = args.Int("requests", 0, 0, int64_t{1} << 40);
    auto temperature = args.Number("temperature", 1.0, 0, 100);
    auto top_k = args.Int("top_k", 40, 0, 1 << 24);
    auto seed = args.Int("seed", 1, 0, int64_t{1} << 62);
    auto engine = args.Choice("engine", "auto", {"auto", "kv_cache", "recompute"});
    auto tokenizer = args.String("tokenizer", "");
    for (const absl::Status& s : {path.status(), batch.status(), tokens.status(),
                                  requests.status(), temperature.status(), top_k.status(),
                                  seed.status(), engine.status(), tokenizer.status()}) {
      if (!s.ok()) return s;
    }
    absl::StatusOr<BackendOptions> backend = ReadTaskBackend(ctx.name, args);
    if (!backend.ok()) return backend.status();
    backend_ = *backend;
    backend_.inference_only = true;
    recompute_ = *engine == "recompute" || (*engine == "auto" && backend_.device == "cuda");
    if (!recompute_ && backend_.device == "cuda") {
      return absl::InvalidArgumentError(absl::StrFormat(
          "side task '%s': engine = \"kv_cache\" runs on the CPU; on device = \"cuda\" use "
          "engine = \"recompute\" (or \"auto\")",
          ctx.name));
    }
    if (path->empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "side task '%s': args.checkpoint is required (an llm.c model file)", ctx.name));
    }
    absl::StatusOr<GPT2Config> config = ReadLlmcModelConfig(*path);
    if (!config.ok()) return config.status();
    path_ = *path, config_ = *config, batch_ = *batch, requests_ = *requests;
    max_tokens_ = std::min<int64_t>(*tokens, config_.max_seq_len - 1);
    // A restart samples anew.
    sampler_.emplace(*temperature, *top_k, static_cast<uint64_t>(*seed + ctx.restarts));
    // Text beside the ids: a tokenizer named must load; the default only where it exists
    // (ids alone otherwise, and the summary says so).
    const std::string ranks = tokenizer->empty() ? kDefaultTokenizerPath : *tokenizer;
    if (!tokenizer->empty() || std::ifstream(ranks).good()) {
      absl::StatusOr<std::unique_ptr<Tokenizer>> loaded = Tokenizer::Load(ranks);
      if (!loaded.ok()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "side task '%s': args.tokenizer = \"%s\": %s", ctx.name, ranks,
            loaded.status().message()));
      }
      tokenizer_ = *std::move(loaded);
    }
    return absl::OkStatus();
  }

  absl::Status Load(SideTaskContext& ctx) override {
    // A checkpoint's model.bin is checked against its manifest each time it is read: a corrupt
    // one fails the task, by name, instead of generating from wrong numbers.
    FR_RETURN_IF_ERROR(VerifyModelFile(path_));
    absl::StatusOr<LlmcModel> model = ReadLlmcModel(path_);
    if (!model.ok()) return model.status();
    if (recompute_) {
      absl::StatusOr<std::unique_ptr<StageModel>> stage =
          MakeTaskModel(ctx, backend_, config_, batch_, max_tokens_ + 1);
      if (!stage.ok()) return stage.status();
      FR_RETURN_IF_ERROR((*stage)->SetParams(model->params.data()));
      engine_ = std::make_unique<RecomputeEngine>(*std::move(stage));
    } else {
      absl::StatusOr<float*> weights = ctx.arena->AllocateArray<float>(
          static_cast<int64_t>(model->params.size()), "gpt_infer weights");
      if (!weights.ok()) return weights.status();
      std::copy(model->params.begin(), model->params.end(), *weights);
      const int64_t floats = KvDecoderWorkspaceFloats(config_, batch_, max_tokens_ + 1);
      absl::StatusOr<float*> workspace =
          ctx.arena->AllocateArray<float>(floats, "gpt_infer KV cache");
      if (!workspace.ok()) return workspace.status();
      FR_ASSIGN_OR_RETURN(
          std::unique_ptr<KvDecoder<float>> decoder,
          MakeKvDecoder<float>(config_, *weights, batch_, max_tokens_ + 1, *workspace));
      engine_ = std::make_unique<KvCacheEngine>(std::move(decoder));
    }
    StartBatch();
    return absl::OkStatus();
  }

  absl::StatusOr<double> Step(SideTaskContext& ctx) override {
    absl::StatusOr<const float*> logits = engine_->Step(current_.data());
    if (!logits.ok()) return logits.status();
    const int64_t V = config_.vocab_size, Vp = config_.padded_vocab_size;
    for (int64_t b = 0; b < batch_; ++b) {
      current_[b] = sampler_->Next(*logits + b * Vp, V);
      generated_[b].push_back(current_[b]);
    }
    if (engine_->position() >= max_tokens_) {
      std::ofstream out(ctx.results_dir + "/generations.txt", std::ios::app);
      for (const auto& seq : generated_) out << absl::StrJoin(seq, " ") << "\n";
      if (tokenizer_) {
        std::ofstream text(ctx.results_dir + "/generations.jsonl", std::ios::app);
        int64_t sequence = sequences_;
        for (const auto& seq : generated_) {
          absl::StatusOr<std::string> decoded = tokenizer_->Decode(seq);
          if (!decoded.ok()) return decoded.status();
          text << absl::StrFormat("{\"sequence\": %d, \"tokens\": [%s], \"text\": %s}\n",
                                  sequence++, absl::StrJoin(seq, ", "), JsonString(*decoded));
        }
      }
      sequences_ += batch_;
      StartBatch();
    }
    tokens_ += batch_;
    return static_cast<double>(batch_);
  }

  absl::Status Unload(SideTaskContext&) override {
    engine_.reset();
    return absl::OkStatus();
  }
  bool Done() const override { return requests_ > 0 && sequences_ >= requests_; }
  std::string UnitName() const override { return "tokens"; }
  std::string Summary() const override {
    return absl::StrFormat("%d tokens, %d complete sequences of %d (batch %d)%s", tokens_,
                           sequences_, max_tokens_, batch_,
                           tokenizer_ ? "" : "; token ids only (no tokenizer ranks found)");
  }

 private:
  void StartBatch() {
    engine_->Reset();
    const int32_t start = config_.vocab_size > 50256 ? 50256 : 0;  // <|endoftext|>
    current_.assign(batch_, start);
    generated_.assign(batch_, {});
  }
  std::string path_;
  GPT2Config config_;
  int64_t batch_ = 4, max_tokens_ = 64, requests_ = 0, sequences_ = 0, tokens_ = 0;
  std::optional<TokenSampler> sampler_;
  BackendOptions backend_;
  bool recompute_ = false;
  std::unique_ptr<TokenEngine> engine_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<int32_t> current_;
  std::vector<std::vector<int32_t>> generated_;
};

}  // namespace

FREERIDE_REGISTER_SIDE_TASK(GptInferTask, "gpt_infer");

}  // namespace freeride
