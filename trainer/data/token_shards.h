// Token shards in llm.c's format: a 256 × int32 header (magic 20240520, version 1, token
// count) followed by the tokens as uint16. And the loader that cuts them into batches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace freeride {

inline constexpr int kShardMagic = 20240520;
inline constexpr int kShardVersion = 1;

absl::Status WriteTokenShard(const std::string& path, const std::vector<uint16_t>& tokens);
absl::StatusOr<std::vector<uint16_t>> ReadTokenShard(const std::string& path);

// Paths matching a glob (a plain path matches itself), sorted; an error names the pattern
// when nothing matches.
absl::StatusOr<std::vector<std::string>> ExpandGlob(const std::string& pattern);

// Where a loader is: enough to resume it exactly.
struct LoaderPosition {
  int64_t epoch = 0;
  int64_t shard = 0;   // index into the visiting order of this epoch
  int64_t window = 0;  // index into the windows of that shard
  friend bool operator==(const LoaderPosition&, const LoaderPosition&) = default;
};

// Batches of B sequences × T tokens (inputs) with their next-token targets. Without
// shuffling, batch k of a shard is the token window starting at k·B·T (llm.c's semantics),
// and a shard too short for the next window hands over to the next shard. With shuffling the
// shards and the windows inside each are visited in an order drawn from (seed, epoch).
class TokenLoader {
 public:
  static absl::StatusOr<TokenLoader> Open(const std::string& pattern, int64_t B, int64_t T,
                                          bool shuffle, uint64_t seed);

  // Fills inputs[B·T] and targets[B·T].
  void Next(int32_t* inputs, int32_t* targets);
  void Reset() { Seek({}); }
  const LoaderPosition& position() const { return position_; }
  void Seek(const LoaderPosition& position);
  int64_t total_tokens() const { return total_tokens_; }
  // The largest token id in any shard (ids at or above a model's vocabulary are refused).
  int32_t max_token() const { return max_token_; }
  // Batches in one pass over every shard.
  int64_t batches_per_epoch() const;
  const std::vector<std::string>& files() const { return files_; }

 private:
  void PrepareEpoch();
  int64_t WindowsIn(int64_t shard_file) const;

  std::vector<std::string> files_;
  std::vector<std::vector<uint16_t>> shards_;
  int64_t B_ = 0, T_ = 0, total_tokens_ = 0;
  int32_t max_token_ = 0;
  bool shuffle_ = false;
  uint64_t seed_ = 0;
  LoaderPosition position_;
  std::vector<int64_t> shard_order_;                // this epoch's visiting order of files
  std::vector<std::vector<int64_t>> window_order_;  // per file, this epoch's window order
};

}  // namespace freeride
