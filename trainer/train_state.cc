#include "trainer/train_state.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "core/files.h"
#include "models/llmc_checkpoint.h"
#include "trainer/checkpoint_manifest.h"
#include "trainer/moment_shards.h"

namespace freeride {
namespace {

constexpr char kMagic[8] = {'F', 'R', 'S', 'T', 'A', 'T', 'E', '\0'};
constexpr int kHeaderInts = 20;

}  // namespace

std::string RankStateFileName(int stage) { return absl::StrFormat("state_r%03d.bin", stage); }

absl::Status WriteRankState(const std::string& path, const RankState& s) {
  const int64_t n = static_cast<int64_t>(s.params.size());
  const int64_t header[kHeaderInts] = {kTrainStateVersion,
                                       s.step,
                                       n,
                                       s.model.max_seq_len,
                                       s.model.vocab_size,
                                       s.model.padded_vocab_size,
                                       s.model.n_layer,
                                       s.model.n_head,
                                       s.model.n_embd,
                                       s.pp,
                                       s.chunks,
                                       s.stage,
                                       s.dp,
                                       s.data.epoch,
                                       s.data.shard,
                                       s.data.window,
                                       s.batch_size,
                                       s.seq_len,
                                       s.train_steps,
                                       s.moment_shards};
  std::vector<int64_t> layers;
  for (const auto& [first, last] : s.chunk_layers) layers.insert(layers.end(), {first, last});
  if (static_cast<int64_t>(s.chunk_layers.size()) != s.chunks) {
    return absl::InternalError(absl::StrFormat("%s: %d chunk layer ranges for %d chunks", path,
                                               s.chunk_layers.size(), s.chunks));
  }
  const size_t layer_bytes = layers.size() * sizeof(int64_t);
  const bool sharded = s.moment_shards > 0;
  if (!sharded && (s.m.size() != s.params.size() || s.v.size() != s.params.size())) {
    return absl::InternalError(
        absl::StrFormat("%s: %d moments for %d parameters", path, s.m.size(), n));
  }
  const int64_t vectors = sharded ? 1 : 3;
  std::string bytes(sizeof(kMagic) + sizeof(header) + layer_bytes + vectors * n * sizeof(float),
                    '\0');
  char* p = bytes.data();
  std::memcpy(p, kMagic, sizeof(kMagic));
  std::memcpy(p += sizeof(kMagic), header, sizeof(header));
  std::memcpy(p += sizeof(header), layers.data(), layer_bytes);
  p += layer_bytes;
  for (const std::vector<float>* v : {&s.params, &s.m, &s.v}) {
    if (v != &s.params && sharded) break;
    std::memcpy(p, v->data(), n * sizeof(float));
    p += n * sizeof(float);
  }
  return WriteFileAtomically(path, bytes);
}

absl::StatusOr<RankState> ReadRankState(const std::string& path) {
  if (absl::Status s = CheckRegularFile(path); !s.ok()) return s;
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  int64_t h[kHeaderInts];
  if (bytes->size() < sizeof(kMagic) + sizeof(h) ||
      std::memcmp(bytes->data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: not a freeride training state (bad magic or truncated)", path));
  }
  std::memcpy(h, bytes->data() + sizeof(kMagic), sizeof(h));
  if (h[0] < 1 || h[0] > kTrainStateVersion) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: training state version %d; this build reads versions 1 to %d", path, h[0],
        kTrainStateVersion));
  }
  RankState s;
  const int64_t n = h[2];
  s.step = h[1];
  s.model = {h[3], h[4], h[5], h[6], h[7], h[8]};
  s.pp = h[9];
  s.chunks = h[10];
  s.stage = h[11];
  s.dp = h[12];
  s.data = {h[13], h[14], h[15]};
  const bool v2 = h[0] >= 2;
  if (v2) {
    s.batch_size = h[16];
    s.seq_len = h[17];
  }
  if (h[0] >= 3) s.train_steps = h[18];
  if (h[0] >= 4) s.moment_shards = h[19];
  const int64_t layer_ints = v2 ? 2 * s.chunks : 0;
  const int64_t vectors = s.moment_shards > 0 ? 1 : 3;
  const size_t expected = sizeof(kMagic) + sizeof(h) + layer_ints * sizeof(int64_t) +
                          vectors * std::max<int64_t>(n, 0) * sizeof(float);
  if (n < 0 || s.chunks < 1 || s.chunks > 4096 || s.moment_shards < 0 ||
      s.moment_shards > 1 << 20 || bytes->size() != expected) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d bytes, expected %d for %d parameters (truncated or corrupt)", path,
        bytes->size(), expected, n));
  }
  const char* p = bytes->data() + sizeof(kMagic) + sizeof(h);
  for (int64_t c = 0; c < layer_ints / 2; ++c) {
    int64_t range[2];
    std::memcpy(range, p, sizeof(range));
    p += sizeof(range);
    s.chunk_layers.emplace_back(range[0], range[1]);
  }
  for (std::vector<float>* v : {&s.params, &s.m, &s.v}) {
    if (v != &s.params && s.moment_shards > 0) break;  // in the share files
    v->resize(n);
    std::memcpy(v->data(), p, n * sizeof(float));
    p += n * sizeof(float);
  }
  return s;
}

std::string CheckpointStagingDir(const std::string& dir, int64_t step) {
  return (std::filesystem::path(dir) / (CheckpointDirName(step) + ".partial")).string();
}

absl::Status StartCheckpoint(const std::string& dir, int64_t step) {
  std::error_code ec;
  const std::string staging = CheckpointStagingDir(dir, step);
  std::filesystem::remove_all(staging, ec);
  return MakeDirectories(staging);
}

void AbandonCheckpoint(const std::string& dir, int64_t step) {
  std::error_code ec;
  std::filesystem::remove_all(CheckpointStagingDir(dir, step), ec);
}

absl::StatusOr<std::string> FinishCheckpoint(const std::string& dir, const RankState& state,
                                             const float* whole_params) {
  namespace fs = std::filesystem;
  const std::string staging = CheckpointStagingDir(dir, state.step);
  const std::string name = CheckpointDirName(state.step);
  const std::string final_dir = (fs::path(dir) / name).string();
  // A full disk or a failed write must not leave a step_N.partial behind to fill it further.
  auto abandon = [&](absl::Status status) {
    AbandonCheckpoint(dir, state.step);
    return status;
  };
  std::vector<std::string> files;
  for (int64_t stage = 0; stage < state.pp; ++stage) {
    files.push_back(RankStateFileName(static_cast<int>(stage)));
    for (int64_t replica = 0; replica < state.moment_shards; ++replica) {
      files.push_back(MomentShardFileName(stage, replica));
    }
  }
  if (whole_params != nullptr) {
    if (absl::Status s = WriteLlmcModel((fs::path(staging) / "model.bin").string(), state.model,
                                        whole_params);
        !s.ok()) {
      return abandon(s);
    }
    files.push_back("model.bin");
  }
  if (absl::Status s = WriteCheckpointManifest(staging, state, files); !s.ok()) {
    return abandon(s);
  }
  std::error_code ec;
  fs::remove_all(final_dir, ec);
  fs::rename(staging, final_dir, ec);
  if (ec) {
    return abandon(absl::InternalError(
        absl::StrFormat("cannot rename %s to %s: %s", staging, final_dir, ec.message())));
  }
  if (absl::Status s = WriteFileAtomically((fs::path(dir) / "latest").string(), name + "\n");
      !s.ok()) {
    return s;
  }
  return final_dir;
}

absl::StatusOr<std::string> LatestCheckpoint(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string file = (fs::path(dir) / "latest").string();
  absl::StatusOr<std::string> latest = ReadFile(file);
  if (!latest.ok()) return latest.status();
  const std::string name(absl::StripAsciiWhitespace(*latest));
  int64_t step = 0;
  if (!ParseCheckpointDirName(name, &step)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s holds '%s', not the name of a checkpoint directory inside %s (step_NNNNNNNN): "
        "refused, so that it cannot point outside the checkpoint directory",
        file, name, dir));
  }
  return (fs::path(dir) / name).string();
}

absl::StatusOr<std::vector<std::string>> PruneCheckpoints(const std::string& dir,
                                                          int64_t keep_last) {
  namespace fs = std::filesystem;
  std::vector<std::string> removed;
  if (keep_last <= 0) return removed;
  std::vector<std::pair<int64_t, fs::path>> steps;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    int64_t step = 0;
    if (it->is_directory() && ParseCheckpointDirName(it->path().filename().string(), &step)) {
      steps.emplace_back(step, it->path());
    }
  }
  if (ec) {
    return absl::InternalError(absl::StrFormat("cannot list %s: %s", dir, ec.message()));
  }
  std::sort(steps.begin(), steps.end());
  const absl::StatusOr<std::string> latest = LatestCheckpoint(dir);
  const int64_t excess = static_cast<int64_t>(steps.size()) - keep_last;
  for (int64_t i = 0; i < excess; ++i) {
    const fs::path& path = steps[i].second;
    if (latest.ok() && fs::path(*latest) == path) continue;
    fs::remove_all(path, ec);
    if (ec) {
      return absl::InternalError(absl::StrFormat("checkpoint.keep_last: cannot remove %s: %s",
                                                 path.string(), ec.message()));
    }
    removed.push_back(path.string());
  }
  return removed;
}

int64_t DirectoryBytes(const std::string& dir) {
  namespace fs = std::filesystem;
  int64_t bytes = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec)) bytes += static_cast<int64_t>(it->file_size(ec));
  }
  return bytes;
}

absl::StatusOr<std::string> ResolveCheckpoint(const std::string& resume, const std::string& dir) {
  namespace fs = std::filesystem;
  std::string path = resume;
  if (resume == "latest") {
    if (!fs::exists(fs::path(dir) / "latest")) {
      return absl::NotFoundError(absl::StrFormat(
          "checkpoint.resume = \"latest\" but %s/latest does not exist (no checkpoint yet)",
          dir));
    }
    absl::StatusOr<std::string> latest = LatestCheckpoint(dir);
    if (!latest.ok()) return latest.status();
    path = *latest;
  }
  if (!fs::exists(fs::path(path) / RankStateFileName(0))) {
    return absl::NotFoundError(absl::StrFormat(
        "checkpoint.resume: %s is not a checkpoint directory (no %s in it)", path,
        RankStateFileName(0)));
  }
  return path;
}

absl::StatusOr<std::string> ModelFileOf(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(path)) return path;
  if (fs::exists(fs::path(path) / "latest")) {
    absl::StatusOr<std::string> latest = LatestCheckpoint(path);
    if (!latest.ok()) return latest.status();
    return (fs::path(*latest) / "model.bin").string();
  }
  return (fs::path(path) / "model.bin").string();
}

}  // namespace freeride
