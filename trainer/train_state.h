// Training checkpoints: everything needed to continue a run bit for bit. A checkpoint is a
// directory `<checkpoint.dir>/step_NNNNNNNN/` holding
//   manifest.json      format, version, step, model shape, ranks, their files and every
//                      file's size and CRC-32C (trainer/checkpoint_manifest.h)
//   state_rNNN.bin     per rank: its stage's parameters, AdamW moments, data position
//   model.bin          the whole model as an llm.c checkpoint (for sample, eval, llm.c)
// written under a temporary name and renamed into place, then `latest` (a one-line file
// naming the newest step directory) is replaced atomically: a crash never leaves a torn
// checkpoint, and `latest` only ever names complete ones.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "models/checkpoint_verify.h"  // CheckpointDirName, ParseCheckpointDirName
#include "models/gpt2_config.h"
#include "trainer/data/token_shards.h"

namespace freeride {

// Version 2 adds the batch geometry and each chunk's layers (for resuming under another
// layout), version 3 the run's train.steps (the length its learning-rate schedule was shaped
// for), version 4 ZeRO-1's moments in share files (moment_shards); versions 1 to 3 are still
// read.
inline constexpr int kTrainStateVersion = 4;

// One pipeline stage's state (data-parallel replicas hold the same, so replica 0 writes it):
// its chunks' parameters and AdamW moments (unless sharded), concatenated in chunk order.
struct RankState {
  int64_t step = 0;  // optimizer steps completed
  GPT2Config model;
  int64_t pp = 1, dp = 1, chunks = 1, stage = 0;
  LoaderPosition data;
  int64_t batch_size = 0, seq_len = 0;  // per replica; 0 in version 1 files
  int64_t train_steps = 0;              // train.steps of the run; 0 before version 3
  // [first_layer, last_layer) of each chunk this stage holds, in chunk order (empty in
  // version 1 files, which always split evenly).
  std::vector<std::pair<int64_t, int64_t>> chunk_layers;
  // ZeRO-1 (parallel.zero = 1): the moments are in this many share files, one per
  // data-parallel rank (trainer/moment_shards.h), and the file holds the parameters only;
  // 0: m and v here (and always before version 4).
  int64_t moment_shards = 0;
  std::vector<float> params, m, v;
};

absl::Status WriteRankState(const std::string& path, const RankState& state);
absl::StatusOr<RankState> ReadRankState(const std::string& path);

std::string RankStateFileName(int stage);

// Writing a checkpoint of `step` under `dir`, in three moves: the directory a checkpoint is
// assembled in (rank 0 creates it, every stage writes its state file into it), then
// FinishCheckpoint (rank 0, once every state file is written): the manifest, the llm.c
// model file when `whole_params` is given, the rename into place, and `latest`. A checkpoint
// that fails on the way removes its staging directory: only complete ones are left.
std::string CheckpointStagingDir(const std::string& dir, int64_t step);
absl::Status StartCheckpoint(const std::string& dir, int64_t step);
absl::StatusOr<std::string> FinishCheckpoint(const std::string& dir, const RankState& state,
                                             const float* whole_params);

// Removes what a checkpoint of `step` that did not finish left under `dir`.
void AbandonCheckpoint(const std::string& dir, int64_t step);

// The checkpoint `dir/latest` names. It must name a checkpoint directory inside `dir`
// (step_NNNNNNNN): a `latest` holding a path is refused, never followed out of `dir`.
absl::StatusOr<std::string> LatestCheckpoint(const std::string& dir);

// Removes the oldest step_N directories of checkpoint directory `dir` until `keep_last` remain
// (0 keeps all), never the one `latest` names; returns the removed paths, oldest first.
absl::StatusOr<std::vector<std::string>> PruneCheckpoints(const std::string& dir,
                                                          int64_t keep_last);

// The bytes of every file under `dir`.
int64_t DirectoryBytes(const std::string& dir);

// Resolves checkpoint.resume: "latest" reads `dir/latest`; anything else is a checkpoint
// directory path. Errors say what is missing.
absl::StatusOr<std::string> ResolveCheckpoint(const std::string& resume, const std::string& dir);

// The model file behind a path: for a checkpoint.dir (holding `latest`), the newest
// checkpoint's model.bin; for a checkpoint directory, its model.bin; else the path itself.
absl::StatusOr<std::string> ModelFileOf(const std::string& path);

}  // namespace freeride
