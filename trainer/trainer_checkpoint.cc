// Checkpoints of a training run: every stage's state (parameters, AdamW moments, data
// position) and the whole model as an llm.c file, written atomically; and resuming from them.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <tuple>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/files.h"
#include "core/host_memory.h"
#include "core/logging.h"
#include "core/status.h"
#include "models/llmc_checkpoint.h"
#include "trainer/checkpoint_manifest.h"
#include "trainer/checkpoint_writer.h"
#include "trainer/moment_shards.h"
#include "trainer/optimizer.h"
#include "trainer/train_state.h"
#include "trainer/trainer.h"

namespace freeride {

namespace {

std::string DescribeLayout(const RankState& s) {
  return absl::StrFormat("pp = %d, dp = %d, chunks = %d", s.pp, s.dp, s.chunks);
}

// What differs between the model a checkpoint holds and the one a run builds, key by key.
std::string ModelDifferences(const GPT2Config& saved, const GPT2Config& run) {
  std::vector<std::string> diffs;
  for (const auto& [key, a, b] :
       {std::tuple{"model.n_layer", saved.n_layer, run.n_layer},
        std::tuple{"model.n_head", saved.n_head, run.n_head},
        std::tuple{"model.n_embd", saved.n_embd, run.n_embd},
        std::tuple{"model.max_seq_len", saved.max_seq_len, run.max_seq_len},
        std::tuple{"model.vocab_size", saved.vocab_size, run.vocab_size}}) {
    if (a != b) diffs.push_back(absl::StrFormat("%s is %d there, %d here", key, a, b));
  }
  if (saved.arch != run.arch) {
    diffs.push_back(absl::StrFormat("model.arch is \"%s\" there, \"%s\" here",
                                    ModelArchName(saved.arch), ModelArchName(run.arch)));
  } else if (saved != run) {
    diffs.push_back(
        "the llama keys (n_kv_head, ffn_hidden, rope_theta, norm_eps, "
        "tie_embeddings) differ");
  }
  return absl::StrJoin(diffs, "; ");
}

// The chunks a saved stage held, as the model pieces they were. Version 1 files (no layer
// ranges) come from loop placements, virtual stage c·pp + stage.
absl::StatusOr<std::vector<StageSpec>> SavedChunkSpecs(const RankState& s, const std::string& file,
                                                       const std::vector<StageSpec>& even) {
  std::vector<StageSpec> specs;
  const int64_t V = s.pp * s.chunks;
  for (int64_t c = 0; c < s.chunks; ++c) {
    const int64_t vs = c * s.pp + s.stage;
    StageSpec spec = even[vs];
    spec.has_embedding = vs == 0;
    spec.has_head = vs == V - 1;
    if (!s.chunk_layers.empty()) {
      // Written with its layer ranges, whatever the placement: the embedding's chunk starts
      // the model and the head's ends it.
      spec.first_layer = s.chunk_layers[c].first;
      spec.last_layer = s.chunk_layers[c].second;
      spec.has_embedding = spec.first_layer == 0;
      spec.has_head = spec.last_layer == s.model.n_layer;
    }
    specs.push_back(spec);
  }
  int64_t total = 0;
  for (const StageSpec& spec : specs) total += MakeParamLayout(s.model, spec).total;
  if (total != static_cast<int64_t>(s.params.size())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s holds %d parameters, but its chunks' layers make %d (a layer split this build "
        "cannot recover)", file, s.params.size(), total));
  }
  return specs;
}

// A stage's state file of checkpoint `dir`, checked against the manifest's checksum first: a
// file corrupted on disk must not resume into other losses.
absl::StatusOr<RankState> ReadVerifiedRankState(const std::string& dir, int64_t stage) {
  const std::string name = RankStateFileName(static_cast<int>(stage));
  if (absl::Status s = VerifyCheckpointFile(dir, name); !s.ok()) return s;
  absl::StatusOr<RankState> state = ReadRankState((std::filesystem::path(dir) / name).string());
  if (!state.ok()) return state;
  // ZeRO-1's moments, whole again from every data-parallel rank's share.
  if (state->moment_shards > 0) FR_RETURN_IF_ERROR(AssembleStageMoments(dir, &*state));
  // The state files hold GPT-2's shape fields; the family and a Llama's own fields are in
  // model.bin's header (beside them in every checkpoint).
  absl::StatusOr<GPT2Config> whole =
      ReadLlmcModelConfig((std::filesystem::path(dir) / "model.bin").string());
  if (whole.ok() && whole->is_llama()) {
    GPT2Config family = *whole;
    family.n_layer = state->model.n_layer;  // the state file's shape rules where they differ
    family.n_head = state->model.n_head;
    family.n_embd = state->model.n_embd;
    family.max_seq_len = state->model.max_seq_len;
    family.vocab_size = state->model.vocab_size;
    family.padded_vocab_size = state->model.padded_vocab_size;
    state->model = family;
  }
  return state;
}

int64_t NumParams(const std::vector<std::unique_ptr<StageModel>>& chunks) {
  int64_t n = 0;
  for (const auto& chunk : chunks) n += chunk->num_params();
  return n;
}

}  // namespace

absl::Status Trainer::Resume(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string own_file = (fs::path(path) / RankStateFileName(layout_.stage)).string();
  absl::StatusOr<RankState> first = ReadVerifiedRankState(path, 0);
  if (!first.ok()) return first.status();
  if (!(first->model == model_config_)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s holds another model than this run builds (%s): resume it with the model it was "
        "trained with",
        path, ModelDifferences(first->model, model_config_)));
  }
  const TrainConfig& tc = config_.train;
  const int64_t global = tc.batch_size * layout_.dp * tc.seq_len;
  if (first->batch_size > 0 && first->batch_size * first->dp * first->seq_len != global) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s was trained on batches of %d × %d sequences of %d tokens (dp × train.batch_size × "
        "train.seq_len); this run's are %d × %d × %d: the data position only carries over when "
        "the global batch stays the same (keep dp × batch_size = %d and seq_len = %d)",
        path, first->dp, first->batch_size, first->seq_len, layout_.dp, tc.batch_size,
        tc.seq_len, first->dp * first->batch_size, first->seq_len));
  }
  const std::vector<StageSpec> mine = [&] {
    std::vector<StageSpec> specs;
    for (const auto& chunk : chunks_) specs.push_back(chunk->stage());
    return specs;
  }();
  if (absl::Status s =
          CheckScheduleOnResume(config_.optim, first->step, first->train_steps, tc.steps);
      !s.ok()) {
    return UsageError(absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message())));
  }
  const bool same_layout = first->pp == layout_.pp && first->chunks == layout_.chunks;
  std::vector<std::vector<float>> params(chunks_.size()), m(chunks_.size()), v(chunks_.size());
  RankState own;
  if (same_layout) {
    absl::StatusOr<RankState> state =
        layout_.stage == 0 ? first : ReadVerifiedRankState(path, layout_.stage);
    if (!state.ok()) return state.status();
    own = *std::move(state);
  }
  absl::StatusOr<std::vector<StageSpec>> even =
      SplitIntoStages(model_config_, first->pp * first->chunks, {});
  if (!even.ok()) return even.status();
  // Version 1 files do not say how their layers were split: with the same layout they are
  // taken as this run splits them, as before.
  std::vector<StageSpec> own_specs = mine;
  if (same_layout && !own.chunk_layers.empty()) {
    absl::StatusOr<std::vector<StageSpec>> specs = SavedChunkSpecs(own, own_file, *even);
    if (!specs.ok()) return specs.status();
    own_specs = *specs;
  }
  if (same_layout && own_specs == mine) {
    if (static_cast<int64_t>(own.params.size()) != NumParams(chunks_)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s holds %d parameters; this rank's chunks hold %d", own_file, own.params.size(),
          NumParams(chunks_)));
    }
    int64_t offset = 0;
    for (size_t c = 0; c < chunks_.size(); ++c) {
      const int64_t n = chunks_[c]->num_params();
      params[c].assign(own.params.begin() + offset, own.params.begin() + offset + n);
      m[c].assign(own.m.begin() + offset, own.m.begin() + offset + n);
      v[c].assign(own.v.begin() + offset, own.v.begin() + offset + n);
      offset += n;
    }
  } else {
    // Another layout: assemble the whole model and its AdamW moments from every saved stage,
    // then take this rank's chunks out of it. The embedding's chunk is copied last, so the
    // tied wte comes from it (the head's copy is equal).
    const int64_t total = NumParameters(model_config_);
    std::vector<float> whole_p(total), whole_m(total), whole_v(total);
    for (int64_t stage = first->pp - 1; stage >= 0; --stage) {
      const std::string file = (fs::path(path) / RankStateFileName(stage)).string();
      absl::StatusOr<RankState> state = stage == 0 ? first : ReadVerifiedRankState(path, stage);
      if (!state.ok()) return state.status();
      absl::StatusOr<std::vector<StageSpec>> specs = SavedChunkSpecs(*state, file, *even);
      if (!specs.ok()) return specs.status();
      int64_t offset = 0;
      std::vector<std::pair<StageSpec, int64_t>> pieces;
      for (const StageSpec& spec : *specs) {
        pieces.emplace_back(spec, offset);
        offset += MakeParamLayout(model_config_, spec).total;
      }
      std::stable_sort(pieces.begin(), pieces.end(), [](const auto& a, const auto& b) {
        return !a.first.has_embedding && b.first.has_embedding;
      });
      for (const auto& [spec, at] : pieces) {
        CopyStageToWhole(model_config_, spec, state->params.data() + at, whole_p.data());
        CopyStageToWhole(model_config_, spec, state->m.data() + at, whole_m.data());
        CopyStageToWhole(model_config_, spec, state->v.data() + at, whole_v.data());
      }
    }
    for (size_t c = 0; c < chunks_.size(); ++c) {
      const int64_t n = chunks_[c]->num_params();
      params[c].resize(n);
      m[c].resize(n);
      v[c].resize(n);
      CopyStageFromWhole(model_config_, mine[c], whole_p.data(), params[c].data());
      CopyStageFromWhole(model_config_, mine[c], whole_m.data(), m[c].data());
      CopyStageFromWhole(model_config_, mine[c], whole_v.data(), v[c].data());
    }
    if (transport_->rank() == 0) {
      FR_LOG(INFO) << absl::StrFormat(
          "resharding %s: saved as %s, resumed as pp = %d, dp = %d, chunks = %d", path,
          DescribeLayout(*first), layout_.pp, layout_.dp, layout_.chunks);
    }
  }
  for (size_t c = 0; c < chunks_.size(); ++c) {
    if (executor_->zero()) {
      // ZeRO-1: this rank's share of the whole moments, packed as the chunk keeps it.
      std::vector<float> mine_m, mine_v;
      for (const ParamRange& r : executor_->buckets()->owned(static_cast<int>(c))) {
        mine_m.insert(mine_m.end(), m[c].begin() + r.offset, m[c].begin() + r.offset + r.n);
        mine_v.insert(mine_v.end(), v[c].begin() + r.offset, v[c].begin() + r.offset + r.n);
      }
      m[c] = std::move(mine_m);
      v[c] = std::move(mine_v);
    }
    absl::Status s = chunks_[c]->SetParams(params[c].data());
    if (s.ok()) s = chunks_[c]->SetOptimizerState(m[c].data(), v[c].data());
    if (!s.ok()) return s;
  }
  step_ = first->step;
  train_->Seek(first->data);
  resumed_ = true;
  first_step_ = step_;
  FR_LOG(PROGRESS) << "resumed from " << path << " at step " << step_;
  return absl::OkStatus();
}

absl::Status Trainer::GatherMaster(int c, float* params) {
  const StageModel& chunk = *chunks_[c];
  const int64_t n = chunk.num_params();
  if (chunk.MasterParamElements() == n) return absl::OkStatus();
  // Every element has one owner, and the others add -0, which leaves any value as it is
  // (+0 included): the sum is the owner's bits, in any order.
  std::vector<float> mine(n, -0.0f);
  for (const ParamRange& r : executor_->buckets()->owned(c)) {
    std::copy_n(params + r.offset, r.n, mine.begin() + r.offset);
  }
  FR_RETURN_IF_ERROR(transport_->AllReduceSum(mine.data(), n, layout_.DataParallelGroup(),
                                              config_.runtime.comm_timeout_s));
  std::copy(mine.begin(), mine.end(), params);
  return absl::OkStatus();
}

absl::StatusOr<std::string> Trainer::SaveCheckpoint(bool background) {
  if (absl::Status s = CompleteParams(); !s.ok()) return s;
  const bool leader = transport_->rank() == 0;
  // Disk time is real time, whatever clock the steps run on.
  const auto start = std::chrono::steady_clock::now();
  if (checkpoint_writer_.busy()) {
    const bool waits = checkpoint_writer_.writing();
    absl::Status previous = checkpoint_writer_.Wait();
    if (!previous.ok()) return previous;
    if (leader && waits) {
      FR_LOG(INFO) << absl::StrFormat(
          "checkpoint %s waited %.2f s for the one before it to be written (one at a time)",
          CheckpointDirName(step_),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  if (leader) {
    FR_LOG(PROGRESS) << "writing checkpoint " << CheckpointDirName(step_) << " to "
                     << checkpoint_dir_ << (background ? " (in the background)" : "");
    if (absl::Status s = StartCheckpoint(checkpoint_dir_, step_); !s.ok()) {
      AbandonCheckpoint(checkpoint_dir_, step_);
      return s;
    }
  }
  // Whatever fails from here on (a full disk, a rank that does not answer), the leader removes
  // the half-written step_N.partial; FinishCheckpoint renames it away once it succeeds.
  absl::Cleanup abandon = [&] {
    if (leader) AbandonCheckpoint(checkpoint_dir_, step_);
  };
  if (absl::Status s = Barrier(); !s.ok()) return s;
  // The snapshot: this rank's state and the whole model, copied out of the chunks.
  auto state = std::make_shared<RankState>();
  state->step = step_;
  state->model = model_config_;
  state->pp = layout_.pp;
  state->dp = layout_.dp;
  state->chunks = layout_.chunks;
  state->stage = layout_.stage;
  state->data = train_->position();
  state->batch_size = config_.train.batch_size;
  state->seq_len = config_.train.seq_len;
  state->train_steps = config_.train.steps;
  for (const auto& chunk : chunks_) {
    state->chunk_layers.emplace_back(chunk->stage().first_layer, chunk->stage().last_layer);
  }
  // ZeRO-1: every rank's share of the moments goes to a file of its own (moment_shards.h).
  const bool sharded = executor_->zero();
  state->moment_shards = sharded ? layout_.dp : 0;
  auto share = std::make_shared<MomentShard>();
  share->step = step_;
  share->stage = layout_.stage;
  share->replica = layout_.replica;
  share->shards = layout_.dp;
  // The whole model for model.bin, gathered by a sum in which each tensor piece has one owner
  // (wte: the embedding's chunk; the head's copy is equal).
  auto whole = std::make_shared<std::vector<float>>(NumParameters(model_config_), 0.0f);
  for (size_t c = 0; c < chunks_.size(); ++c) {
    StageModel& chunk = *chunks_[c];
    const int64_t n = chunk.num_params(), held = chunk.OptimizerStateElements();
    std::vector<float> part(n), m(held), v(held);
    absl::Status got = chunk.GetParams(part.data());
    if (got.ok()) got = chunk.GetOptimizerState(m.data(), v.data());
    if (got.ok() && sharded) got = GatherMaster(static_cast<int>(c), part.data());
    if (!got.ok()) return got;
    if (sharded) {
      for (const ParamRange& r : executor_->buckets()->owned(static_cast<int>(c))) {
        share->ranges.push_back({share->stage_params + r.offset, r.n});
      }
    }
    std::vector<float>& to_m = sharded ? share->m : state->m;
    std::vector<float>& to_v = sharded ? share->v : state->v;
    to_m.insert(to_m.end(), m.begin(), m.end());
    to_v.insert(to_v.end(), v.begin(), v.end());
    share->stage_params += n;
    state->params.insert(state->params.end(), part.begin(), part.end());
    if (!chunk.stage().has_embedding && chunk.stage().has_head) {
      const TensorSlot& wte = chunk.layout().slot(ParamTensor::kWte);
      std::fill(part.begin() + wte.offset, part.begin() + wte.offset + wte.elements, 0.0f);
    }
    CopyStageToWhole(model_config_, chunk.stage(), part.data(), whole->data());
  }
  if (absl::Status s =
          transport_->AllReduceSum(whole->data(), static_cast<int64_t>(whole->size()),
                                   layout_.PipelineGroup(), config_.runtime.comm_timeout_s);
      !s.ok()) {
    return s;
  }
  const std::string dir = checkpoint_dir_;
  const std::string staging = CheckpointStagingDir(dir, step_);
  const bool writes_state = layout_.replica == 0;
  const int stage = static_cast<int>(layout_.stage);
  const std::string share_name = MomentShardFileName(stage, layout_.replica);
  // This rank's state file (replica 0) and moments share (ZeRO-1); where one fails in the
  // background, a mark the leader stops at.
  auto write_state = [=]() -> absl::Status {
    namespace fs = std::filesystem;
    absl::Status s = absl::OkStatus();
    std::string name;
    if (writes_state) {
      name = RankStateFileName(stage);
      s = WriteRankState((fs::path(staging) / name).string(), *state);
    }
    if (s.ok() && sharded) {
      name = share_name;
      s = WriteMomentShard((fs::path(staging) / name).string(), *share);
    }
    if (!s.ok() && background) {
      WriteFileAtomically((fs::path(staging) / FailedFileName(name)).string(),
                          std::string(s.message()))
          .IgnoreError();
    }
    if (s.ok() && (writes_state || sharded)) HoldIfTestAsks(staging, state->step, stage);
    return s;
  };
  // The leader's part once every state file is written: manifest, model.bin, rename, `latest`,
  // the log line and checkpoint.keep_last.
  const int64_t keep_last = config_.checkpoint.keep_last;
  auto finish = [=]() -> absl::StatusOr<std::string> {
    absl::StatusOr<std::string> done = FinishCheckpoint(dir, *state, whole->data());
    if (!done.ok()) return done;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const int64_t bytes = DirectoryBytes(*done);
    FR_LOG(PROGRESS) << absl::StrFormat(
        "checkpoint %s: %s in %.2f s (%.1f MB/s)%s", *done, FormatBytes(bytes), seconds,
        static_cast<double>(bytes) / 1e6 / std::max(seconds, 1e-6),
        background ? ", written in the background while training went on" : "");
    absl::StatusOr<std::vector<std::string>> removed = PruneCheckpoints(dir, keep_last);
    if (!removed.ok()) return removed.status();
    if (!removed->empty()) {
      FR_LOG(INFO) << absl::StrFormat("checkpoint.keep_last = %d: removed %s", keep_last,
                                      absl::StrJoin(*removed, ", "));
    }
    return done;
  };
  const std::string final_dir = (std::filesystem::path(dir) / CheckpointDirName(step_)).string();
  if (background) {
    std::vector<std::string> files;
    for (int64_t s = 0; s < layout_.pp; ++s) {
      files.push_back(RankStateFileName(static_cast<int>(s)));
      for (int64_t r = 0; r < state->moment_shards; ++r) {
        files.push_back(MomentShardFileName(s, r));
      }
    }
    const double timeout_s = config_.runtime.comm_timeout_s;
    std::move(abandon).Cancel();  // the writer's own failures abandon it
    checkpoint_writer_.Start([=]() -> absl::Status {
      absl::Status s = write_state();
      if (!leader) {
        // Busy until the leader has made the checkpoint whole, so that a rank that exits on a
        // second stop signal (or an error) as its write ends cannot end the job before that.
        WaitForCheckpointEnd(dir, state->step, timeout_s);
        return s;
      }
      if (s.ok()) s = WaitForStateFiles(staging, files, timeout_s);
      if (s.ok()) s = finish().status();
      if (!s.ok()) AbandonCheckpoint(dir, state->step);
      return s;
    });
    return final_dir;
  }
  if (absl::Status s = write_state(); !s.ok()) return s;
  if (absl::Status s = Barrier(); !s.ok()) return s;
  absl::StatusOr<std::string> done = final_dir;
  if (leader) done = finish();
  if (done.ok()) std::move(abandon).Cancel();
  if (absl::Status s = Barrier(); !s.ok()) return s;
  return done;
}

}  // namespace freeride
