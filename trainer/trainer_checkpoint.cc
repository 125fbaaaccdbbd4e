// Checkpoints of a training run: every stage's state (parameters, AdamW moments, data
// position) and the whole model as an llm.c file, written atomically; and resuming from them.
#include <filesystem>

#include "absl/strings/str_format.h"
#include "core/logging.h"
#include "models/llmc_checkpoint.h"
#include "trainer/train_state.h"
#include "trainer/trainer.h"

namespace freeride {

absl::Status Trainer::Resume(const std::string& path) {
  absl::StatusOr<RankState> state = ReadRankState(
      (std::filesystem::path(path) / RankStateFileName(layout_.stage)).string());
  if (!state.ok()) return state.status();
  if (!(state->model == model_config_) || state->pp != layout_.pp ||
      state->chunks != layout_.chunks) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the checkpoint holds a model (n_layer %d, n_head %d, n_embd %d, vocab %d) split as "
        "pp = %d, chunks = %d; this run has (n_layer %d, n_head %d, n_embd %d, vocab %d), "
        "pp = %d, chunks = %d",
        path, state->model.n_layer, state->model.n_head, state->model.n_embd,
        state->model.vocab_size, state->pp, state->chunks, model_config_.n_layer,
        model_config_.n_head, model_config_.n_embd, model_config_.vocab_size, layout_.pp,
        layout_.chunks));
  }
  int64_t offset = 0;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const int64_t n = chunks_[c]->num_params();
    absl::Status s = chunks_[c]->SetParams(state->params.data() + offset);
    if (s.ok()) s = chunks_[c]->SetOptimizerState(state->m.data() + offset, state->v.data() + offset);
    if (!s.ok()) return s;
    offset += n;
  }
  step_ = state->step;
  train_->Seek(state->data);
  FR_LOG(INFO) << "resumed from " << path << " at step " << step_;
  return absl::OkStatus();
}

absl::StatusOr<std::string> Trainer::SaveCheckpoint() {
  const bool leader = transport_->rank() == 0;
  if (leader) {
    if (absl::Status s = StartCheckpoint(checkpoint_dir_, step_); !s.ok()) return s;
  }
  if (absl::Status s = Barrier(); !s.ok()) return s;
  RankState state;
  state.step = step_;
  state.model = model_config_;
  state.pp = layout_.pp;
  state.dp = layout_.dp;
  state.chunks = layout_.chunks;
  state.stage = layout_.stage;
  state.data = train_->position();
  // The whole model for model.bin, gathered by a sum in which each tensor piece has one owner
  // (wte: the embedding's chunk; the head's copy is equal).
  std::vector<float> whole(NumParameters(model_config_), 0.0f);
  for (size_t c = 0; c < chunks_.size(); ++c) {
    StageModel& chunk = *chunks_[c];
    const int64_t n = chunk.num_params();
    std::vector<float> part(n), m(n), v(n);
    absl::Status got = chunk.GetParams(part.data());
    if (got.ok()) got = chunk.GetOptimizerState(m.data(), v.data());
    if (!got.ok()) return got;
    state.params.insert(state.params.end(), part.begin(), part.end());
    state.m.insert(state.m.end(), m.begin(), m.end());
    state.v.insert(state.v.end(), v.begin(), v.end());
    if (!chunk.stage().has_embedding && chunk.stage().has_head) {
      const TensorSlot& wte = chunk.layout().slot(ParamTensor::kWte);
      std::fill(part.begin() + wte.offset, part.begin() + wte.offset + wte.elements, 0.0f);
    }
    CopyStageToWhole(model_config_, chunk.stage(), part.data(), whole.data());
  }
  if (absl::Status s = transport_->AllReduceSum(whole.data(), static_cast<int64_t>(whole.size()),
                                                layout_.PipelineGroup(),
                                                config_.runtime.comm_timeout_s);
      !s.ok()) {
    return s;
  }
  if (layout_.replica == 0) {
    absl::Status s = WriteRankState(
        (std::filesystem::path(CheckpointStagingDir(checkpoint_dir_, step_)) /
         RankStateFileName(layout_.stage)).string(), state);
    if (!s.ok()) return s;
  }
  if (absl::Status s = Barrier(); !s.ok()) return s;
  absl::StatusOr<std::string> dir =
      (std::filesystem::path(checkpoint_dir_) / CheckpointDirName(step_)).string();
  if (leader) dir = FinishCheckpoint(checkpoint_dir_, state, whole.data());
  if (absl::Status s = Barrier(); !s.ok()) return s;
  return dir;
}

}  // namespace freeride
