// Single-process training on the CPU backend: the one-stage case of the pipeline code path
// (the same micro-batch loop, gradient accumulation order and optimizer), with validation,
// checkpoints, resume and metrics.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/gpt2.h"
#include "trainer/config.h"
#include "trainer/optimizer.h"
#include "trainer/token_shards.h"

namespace freeride {

struct StepStats {
  int64_t step = 0;  // 1-based: the step just completed
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double step_s = 0;
  double tokens_per_s = 0;
};

// The model shape a config asks for. With model.init_from set, the checkpoint's header rules
// and every model key the config sets explicitly must agree with it.
absl::StatusOr<GPT2Config> ResolveModelConfig(const Config& config);

class Trainer {
 public:
  // Builds the model, data loaders and optimizer; resumes when checkpoint.resume is set.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const Config& config);

  // Runs the remaining steps with logging, evaluation and checkpoints.
  absl::Status Run();
  // One optimizer step over train.microbatches micro-batches.
  StepStats Step();
  // Mean loss over eval.batches validation batches (from the start of the validation data).
  double Evaluate();
  absl::StatusOr<std::string> SaveCheckpoint();

  int64_t step() const { return step_; }
  GPT2Stage<float>& model() { return *model_; }
  const std::string& checkpoint_dir() const { return checkpoint_dir_; }

 private:
  explicit Trainer(const Config& config) : config_(config) {}
  absl::Status Resume(const std::string& path);
  void WriteMetric(const std::string& json);

  Config config_;
  std::unique_ptr<GPT2Stage<float>> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::optional<TokenLoader> train_, val_;
  std::vector<int32_t> inputs_, targets_;
  int64_t step_ = 0;
  std::string checkpoint_dir_;
  std::ofstream metrics_;
};

}  // namespace freeride
