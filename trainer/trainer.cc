#include "trainer/trainer.h"

#include <omp.h>

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/files.h"
#include "core/logging.h"
#include "core/timer.h"
#include "models/llmc_checkpoint.h"
#include "trainer/train_state.h"

namespace freeride {
namespace {

absl::Status CheckAgrees(const Config& config, const std::string& key, int64_t configured,
                         int64_t from_checkpoint, const std::string& path) {
  if (!config.explicit_keys.count(key) || configured == from_checkpoint) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s = %d in the config, but the checkpoint %s (model.init_from) has %d: remove the key "
      "or make them agree",
      key, configured, path, from_checkpoint));
}

// Largest token id in a loader's data: ids at or above the vocabulary would index past the
// embedding, so they are refused before training starts.
absl::Status CheckVocabulary(const std::vector<std::string>& files, int64_t vocab_size) {
  for (const std::string& file : files) {
    absl::StatusOr<std::vector<uint16_t>> tokens = ReadTokenShard(file);
    if (!tokens.ok()) return tokens.status();
    const uint16_t max = tokens->empty() ? 0 : *std::max_element(tokens->begin(), tokens->end());
    if (max >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s holds token %d but model.vocab_size is %d", file, max, vocab_size));
    }
  }
  return absl::OkStatus();
}

std::string FormatDuration(double seconds) {
  if (seconds < 60) return absl::StrFormat("%.0fs", seconds);
  if (seconds < 3600) return absl::StrFormat("%dm%02ds", int(seconds) / 60, int(seconds) % 60);
  return absl::StrFormat("%dh%02dm", int(seconds) / 3600, int(seconds) / 60 % 60);
}

}  // namespace

absl::StatusOr<GPT2Config> ResolveModelConfig(const Config& config) {
  const ModelConfig& m = config.model;
  if (m.init_from.empty()) {
    return MakeGPT2Config(m.n_layer, m.n_head, m.n_embd, m.max_seq_len, m.vocab_size);
  }
  absl::StatusOr<GPT2Config> c = ReadLlmcModelConfig(m.init_from);
  if (!c.ok()) return c.status();
  for (const auto& [key, configured, actual] :
       {std::tuple{"model.n_layer", m.n_layer, c->n_layer},
        std::tuple{"model.n_head", m.n_head, c->n_head},
        std::tuple{"model.n_embd", m.n_embd, c->n_embd},
        std::tuple{"model.max_seq_len", m.max_seq_len, c->max_seq_len},
        std::tuple{"model.vocab_size", m.vocab_size, c->vocab_size}}) {
    if (absl::Status s = CheckAgrees(config, key, configured, actual, m.init_from); !s.ok()) {
      return s;
    }
  }
  return c;
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const Config& config) {
  if (config.runtime.device != "cpu") {
    return absl::UnimplementedError(absl::StrFormat(
        "runtime.device = \"%s\": this build trains on the CPU backend only (the CUDA backend "
        "is not part of it yet)",
        config.runtime.device));
  }
  if (config.parallel.pp * config.parallel.dp != 1) {
    return absl::UnimplementedError(absl::StrFormat(
        "parallel.pp = %d, parallel.dp = %d: pipeline and data-parallel training across ranks "
        "is not part of this build yet; set both to 1",
        config.parallel.pp, config.parallel.dp));
  }
  if (config.runtime.threads > 0) {
    omp_set_num_threads(static_cast<int>(config.runtime.threads));
    openblas_set_num_threads(static_cast<int>(config.runtime.threads));
  }
  std::unique_ptr<Trainer> t(new Trainer(config));
  absl::StatusOr<GPT2Config> model = ResolveModelConfig(config);
  if (!model.ok()) return model.status();
  const TrainConfig& tc = config.train;
  if (tc.seq_len > model->max_seq_len) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "train.seq_len = %d exceeds the model's max_seq_len = %d", tc.seq_len,
        model->max_seq_len));
  }
  const int64_t micro = tc.batch_size / tc.microbatches;
  t->model_ = std::make_unique<GPT2Stage<float>>(*model, WholeModel(*model), micro, tc.seq_len,
                                                 /*slots=*/1);
  if (config.model.init_from.empty()) {
    t->model_->InitRandom(static_cast<uint64_t>(config.run.seed));
  } else {
    absl::StatusOr<LlmcModel> weights = ReadLlmcModel(config.model.init_from);
    if (!weights.ok()) return weights.status();
    std::memcpy(t->model_->params(), weights->params.data(),
                weights->params.size() * sizeof(float));
  }
  t->optimizer_ = std::make_unique<AdamW>(t->model_->num_params());
  absl::StatusOr<TokenLoader> train = TokenLoader::Open(
      config.data.train, tc.batch_size, tc.seq_len, config.data.shuffle, config.run.seed);
  if (!train.ok()) return train.status();
  if (absl::Status s = CheckVocabulary(train->files(), model->vocab_size); !s.ok()) return s;
  t->train_ = *std::move(train);
  if (!config.data.val.empty()) {
    absl::StatusOr<TokenLoader> val =
        TokenLoader::Open(config.data.val, tc.batch_size, tc.seq_len, false, 0);
    if (!val.ok()) return val.status();
    if (absl::Status s = CheckVocabulary(val->files(), model->vocab_size); !s.ok()) return s;
    t->val_ = *std::move(val);
  }
  t->inputs_.resize(tc.batch_size * tc.seq_len);
  t->targets_.resize(tc.batch_size * tc.seq_len);
  t->checkpoint_dir_ = config.checkpoint.dir.empty()
                           ? (std::filesystem::path(config.run.dir) / "checkpoints").string()
                           : config.checkpoint.dir;
  if (!config.checkpoint.resume.empty()) {
    absl::StatusOr<std::string> path =
        ResolveCheckpoint(config.checkpoint.resume, t->checkpoint_dir_);
    if (!path.ok()) return path.status();
    if (absl::Status s = t->Resume(*path); !s.ok()) return s;
  }
  return t;
}

absl::Status Trainer::Resume(const std::string& path) {
  absl::StatusOr<RankState> state = ReadRankState(
      (std::filesystem::path(path) / RankStateFileName(0)).string());
  if (!state.ok()) return state.status();
  if (!(state->model == model_->config()) || !(state->stage == model_->stage())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the checkpoint's model (n_layer %d, n_head %d, n_embd %d, vocab %d) differs from "
        "the config's (n_layer %d, n_head %d, n_embd %d, vocab %d)",
        path, state->model.n_layer, state->model.n_head, state->model.n_embd,
        state->model.vocab_size, model_->config().n_layer, model_->config().n_head,
        model_->config().n_embd, model_->config().vocab_size));
  }
  std::memcpy(model_->params(), state->params.data(), state->params.size() * sizeof(float));
  optimizer_->m() = std::move(state->m);
  optimizer_->v() = std::move(state->v);
  step_ = state->step;
  train_->Seek(state->data);
  FR_LOG(INFO) << "resumed from " << path << " at step " << step_;
  return absl::OkStatus();
}

StepStats Trainer::Step() {
  Timer timer;
  const TrainConfig& tc = config_.train;
  const int64_t m = tc.microbatches, rows = model_->micro_batch() * tc.seq_len;
  train_->Next(inputs_.data(), targets_.data());
  model_->ZeroGrads();
  const float loss_scale = 1.0f / static_cast<float>(tc.batch_size * tc.seq_len);
  double loss = 0;
  for (int64_t j = 0; j < m; ++j) {
    std::memcpy(model_->tokens(0), inputs_.data() + j * rows, rows * sizeof(int32_t));
    std::memcpy(model_->targets(0), targets_.data() + j * rows, rows * sizeof(int32_t));
    loss += model_->Forward(0);
    model_->BackwardInput(0, loss_scale);
    model_->BackwardWeight(0);
  }
  model_->FoldHeadWteGrad();
  double squares = 0;
  for (double unit : GradSquaresByUnit(*model_)) squares += unit;
  StepStats stats;
  stats.grad_norm = std::sqrt(squares);
  stats.lr = LearningRate(config_.optim, step_, tc.steps);
  optimizer_->Update(*model_, config_.optim, stats.lr,
                     ClipScale(stats.grad_norm, config_.optim.grad_clip), step_ + 1);
  stats.step = ++step_;
  stats.loss = loss / static_cast<double>(m);
  stats.step_s = timer.ElapsedSeconds();
  stats.tokens_per_s = static_cast<double>(tc.batch_size * tc.seq_len) / stats.step_s;
  return stats;
}

double Trainer::Evaluate() {
  if (!val_) return NAN;
  val_->Reset();
  const int64_t m = config_.train.microbatches, rows = model_->micro_batch() * config_.train.seq_len;
  double loss = 0;
  for (int64_t b = 0; b < config_.eval.batches; ++b) {
    val_->Next(inputs_.data(), targets_.data());
    for (int64_t j = 0; j < m; ++j) {
      std::memcpy(model_->tokens(0), inputs_.data() + j * rows, rows * sizeof(int32_t));
      std::memcpy(model_->targets(0), targets_.data() + j * rows, rows * sizeof(int32_t));
      loss += model_->Forward(0);
    }
  }
  return loss / static_cast<double>(config_.eval.batches * m);
}

absl::StatusOr<std::string> Trainer::SaveCheckpoint() {
  RankState state;
  state.step = step_;
  state.model = model_->config();
  state.stage = model_->stage();
  state.data = train_->position();
  state.params.assign(model_->params(), model_->params() + model_->num_params());
  state.m = optimizer_->m();
  state.v = optimizer_->v();
  return WriteCheckpoint(checkpoint_dir_, state);
}

void Trainer::WriteMetric(const std::string& json) {
  if (metrics_.is_open()) metrics_ << json << "\n" << std::flush;
}

absl::Status Trainer::Run() {
  const std::string metrics_path = (std::filesystem::path(config_.run.dir) / "metrics.jsonl").string();
  if (absl::Status s = MakeDirectories(config_.run.dir); !s.ok()) return s;
  metrics_.open(metrics_path, step_ > 0 ? std::ios::app : std::ios::trunc);
  if (!metrics_) return absl::InternalError("cannot write " + metrics_path);
  const GPT2Config& c = model_->config();
  FR_LOG(INFO) << absl::StrFormat(
      "model: %d layers, %d heads, width %d, vocab %d (padded %d), %d parameters; batch %d x %d "
      "tokens in %d micro-batches; %d train tokens; %d threads",
      c.n_layer, c.n_head, c.n_embd, c.vocab_size, c.padded_vocab_size, model_->num_params(),
      config_.train.batch_size, config_.train.seq_len, config_.train.microbatches,
      train_->total_tokens(), omp_get_max_threads());
  const int64_t total = config_.train.steps;
  const auto evaluate = [&] {
    if (!val_ || config_.eval.every == 0) return;
    const double val = Evaluate();
    FR_LOG(INFO) << absl::StrFormat("step %d | val loss %.4f", step_, val);
    WriteMetric(absl::StrFormat("{\"kind\": \"val\", \"step\": %d, \"loss\": %.6f}", step_, val));
  };
  if (step_ == 0) evaluate();
  double elapsed = 0;
  int64_t timed = 0;
  while (step_ < total) {
    const StepStats s = Step();
    if (!std::isfinite(s.loss)) {
      return absl::InternalError(absl::StrFormat("step %d: loss is %f; stopping", s.step, s.loss));
    }
    // The first step warms caches and thread pools: leave it out of the ETA.
    if (s.step > 1 || total == 1) elapsed += s.step_s, ++timed;
    const double eta = timed > 0 ? elapsed / timed * static_cast<double>(total - s.step) : 0;
    WriteMetric(absl::StrFormat(
        "{\"kind\": \"train\", \"step\": %d, \"loss\": %.6f, \"lr\": %.6e, \"grad_norm\": %.6f, "
        "\"step_s\": %.6f, \"tokens_per_s\": %.1f}",
        s.step, s.loss, s.lr, s.grad_norm, s.step_s, s.tokens_per_s));
    if (s.step % config_.run.log_every == 0 || s.step == total) {
      FR_LOG(INFO) << absl::StrFormat(
          "step %*d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f ms | %.0f tok/s | eta %s",
          static_cast<int>(std::to_string(total).size()), s.step, total, s.loss, s.lr,
          s.grad_norm, s.step_s * 1e3, s.tokens_per_s, FormatDuration(eta));
    }
    if (config_.eval.every > 0 && (s.step % config_.eval.every == 0 || s.step == total)) {
      evaluate();
    }
    if (config_.checkpoint.every > 0 && s.step % config_.checkpoint.every == 0) {
      absl::StatusOr<std::string> dir = SaveCheckpoint();
      if (!dir.ok()) return dir.status();
      FR_LOG(INFO) << "checkpoint " << *dir;
    }
  }
  absl::StatusOr<std::string> dir = SaveCheckpoint();
  if (!dir.ok()) return dir.status();
  FR_LOG(INFO) << "final checkpoint " << *dir << " (model.bin is an llm.c checkpoint)";
  return absl::OkStatus();
}

}  // namespace freeride
