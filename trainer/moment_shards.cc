#include "trainer/moment_shards.h"

#include <cstring>
#include <filesystem>
#include <limits>

#include "absl/strings/str_format.h"
#include "core/files.h"
#include "core/status.h"
#include "models/checkpoint_verify.h"

namespace freeride {
namespace {

constexpr char kMomentsMagic[8] = {'F', 'R', 'M', 'O', 'M', 'E', 'N', 'T'};
constexpr int64_t kVersion = 1;
constexpr int kMomentsHeaderInts = 8;

}  // namespace

std::string MomentShardFileName(int64_t stage, int64_t replica) {
  return absl::StrFormat("moments_r%03d_d%03d.bin", stage, replica);
}

absl::Status WriteMomentShard(const std::string& path, const MomentShard& s) {
  int64_t held = 0;
  for (const ParamRange& r : s.ranges) held += r.n;
  if (static_cast<int64_t>(s.m.size()) != held || static_cast<int64_t>(s.v.size()) != held) {
    return absl::InternalError(
        absl::StrFormat("%s: %d moments for ranges of %d elements", path, s.m.size(), held));
  }
  const int64_t header[kMomentsHeaderInts] = {kVersion,
                                              s.step,
                                              s.stage,
                                              s.replica,
                                              s.shards,
                                              s.stage_params,
                                              static_cast<int64_t>(s.ranges.size()),
                                              held};
  std::string bytes(sizeof(kMomentsMagic) + sizeof(header) + s.ranges.size() * 2 * sizeof(int64_t) +
                        2 * held * sizeof(float),
                    '\0');
  char* p = bytes.data();
  std::memcpy(p, kMomentsMagic, sizeof(kMomentsMagic));
  std::memcpy(p += sizeof(kMomentsMagic), header, sizeof(header));
  p += sizeof(header);
  for (const ParamRange& r : s.ranges) {
    const int64_t range[2] = {r.offset, r.n};
    std::memcpy(p, range, sizeof(range));
    p += sizeof(range);
  }
  std::memcpy(p, s.m.data(), held * sizeof(float));
  std::memcpy(p + held * sizeof(float), s.v.data(), held * sizeof(float));
  return WriteFileAtomically(path, bytes);
}

absl::StatusOr<MomentShard> ReadMomentShard(const std::string& path) {
  FR_RETURN_IF_ERROR(CheckRegularFile(path));
  FR_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  int64_t h[kMomentsHeaderInts];
  if (bytes.size() < sizeof(kMomentsMagic) + sizeof(h) ||
      std::memcmp(bytes.data(), kMomentsMagic, sizeof(kMomentsMagic)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: not a freeride moments share (bad magic or truncated)", path));
  }
  std::memcpy(h, bytes.data() + sizeof(kMomentsMagic), sizeof(h));
  if (h[0] != kVersion) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: moments share version %d; this build reads %d", path, h[0], kVersion));
  }
  MomentShard s;
  s.step = h[1], s.stage = h[2], s.replica = h[3], s.shards = h[4], s.stage_params = h[5];
  const int64_t ranges = h[6], held = h[7];
  const int64_t max = std::numeric_limits<int32_t>::max();
  if (ranges < 0 || held < 0 || ranges > max || held > s.stage_params ||
      bytes.size() != sizeof(kMomentsMagic) + sizeof(h) + (ranges * 2 * sizeof(int64_t)) +
                          2 * held * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d bytes, not a share of %d ranges and %d moments (truncated or corrupt)", path,
        bytes.size(), ranges, held));
  }
  const char* p = bytes.data() + sizeof(kMomentsMagic) + sizeof(h);
  int64_t sum = 0;
  for (int64_t k = 0; k < ranges; ++k) {
    int64_t range[2];
    std::memcpy(range, p, sizeof(range));
    p += sizeof(range);
    if (range[0] < 0 || range[1] < 0 || range[0] > s.stage_params - range[1]) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: range [%d, +%d) outside the stage's %d parameters", path, range[0],
                          range[1], s.stage_params));
    }
    s.ranges.push_back({range[0], range[1]});
    sum += range[1];
  }
  if (sum != held) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: ranges of %d elements for %d moments", path, sum, held));
  }
  s.m.resize(held);
  s.v.resize(held);
  std::memcpy(s.m.data(), p, held * sizeof(float));
  std::memcpy(s.v.data(), p + held * sizeof(float), held * sizeof(float));
  return s;
}

absl::Status AssembleStageMoments(const std::string& dir, RankState* state) {
  const int64_t n = static_cast<int64_t>(state->params.size());
  state->m.assign(n, 0.0f);
  state->v.assign(n, 0.0f);
  std::vector<char> seen(n, 0);
  for (int64_t replica = 0; replica < state->moment_shards; ++replica) {
    const std::string name = MomentShardFileName(state->stage, replica);
    FR_RETURN_IF_ERROR(VerifyCheckpointFile(dir, name));
    const std::string path = (std::filesystem::path(dir) / name).string();
    FR_ASSIGN_OR_RETURN(MomentShard shard, ReadMomentShard(path));
    if (shard.step != state->step || shard.stage != state->stage || shard.replica != replica ||
        shard.shards != state->moment_shards || shard.stage_params != n) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: a share of step %d, stage %d, replica %d of %d over %d parameters; the "
          "checkpoint's state file wants step %d, stage %d, replica %d of %d over %d",
          path, shard.step, shard.stage, shard.replica, shard.shards, shard.stage_params,
          state->step, state->stage, replica, state->moment_shards, n));
    }
    int64_t at = 0;
    for (const ParamRange& r : shard.ranges) {
      for (int64_t i = r.offset; i < r.offset + r.n; ++i, ++at) {
        if (seen[i]++) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "%s: element %d of stage %d is in two shares", path, i, state->stage));
        }
        state->m[i] = shard.m[at];
        state->v[i] = shard.v[at];
      }
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    if (!seen[i]) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: no moments share of stage %d holds its element %d (%d shares)", dir,
                          state->stage, i, state->moment_shards));
    }
  }
  return absl::OkStatus();
}

}  // namespace freeride
