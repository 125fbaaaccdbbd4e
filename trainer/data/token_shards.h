// Token shards in llm.c's format: a 256 × int32 header (magic 20240520, version, token count)
// followed by the tokens: version 1 as uint16 (GPT-2's), version 2 as uint32 (llm.c's
// Llama-3 shards: vocabularies past 65,536 ids). And the loader that cuts them into batches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace freeride {

inline constexpr int kShardMagic = 20240520;
inline constexpr int kShardVersion = 1;      // uint16 tokens
inline constexpr int kShardVersionWide = 2;  // uint32 tokens

// One shard's tokens, in the width its file has (a 16-bit shard stays 16-bit in memory).
class TokenShard {
 public:
  TokenShard() = default;
  explicit TokenShard(std::vector<uint16_t> narrow) : narrow_(std::move(narrow)) {}
  explicit TokenShard(std::vector<uint32_t> wide) : wide_(std::move(wide)), is_wide_(true) {}
  bool wide() const { return is_wide_; }
  int64_t size() const { return static_cast<int64_t>(is_wide_ ? wide_.size() : narrow_.size()); }
  uint32_t operator[](int64_t i) const { return is_wide_ ? wide_[i] : narrow_[i]; }
  uint32_t max_token() const;

 private:
  std::vector<uint16_t> narrow_;
  std::vector<uint32_t> wide_;
  bool is_wide_ = false;
};

absl::Status WriteTokenShard(const std::string& path, const std::vector<uint16_t>& tokens);
// Version 2: uint32 tokens.
absl::Status WriteTokenShard(const std::string& path, const std::vector<uint32_t>& tokens);
// Either version; errors name the file and what is wrong with its header or length.
absl::StatusOr<TokenShard> ReadTokenShard(const std::string& path);

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
  std::vector<TokenShard> shards_;
  int64_t B_ = 0, T_ = 0, total_tokens_ = 0;
  int32_t max_token_ = 0;
  bool shuffle_ = false;
  uint64_t seed_ = 0;
  LoaderPosition position_;
  std::vector<int64_t> shard_order_;                // this epoch's visiting order of files
  std::vector<std::vector<int64_t>> window_order_;  // per file, this epoch's window order
};

}  // namespace freeride
