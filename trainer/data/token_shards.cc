#include "trainer/data/token_shards.h"

#include <glob.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/files.h"

namespace freeride {

namespace {

template <typename T>
absl::Status WriteShard(const std::string& path, int version, const std::vector<T>& tokens) {
  int32_t header[256] = {};
  header[0] = kShardMagic;
  header[1] = version;
  header[2] = static_cast<int32_t>(tokens.size());
  std::string bytes(sizeof(header) + tokens.size() * sizeof(T), '\0');
  std::memcpy(bytes.data(), header, sizeof(header));
  std::memcpy(bytes.data() + sizeof(header), tokens.data(), tokens.size() * sizeof(T));
  return WriteFileAtomically(path, bytes);
}

}  // namespace

uint32_t TokenShard::max_token() const {
  uint32_t m = 0;
  for (uint16_t t : narrow_) m = std::max<uint32_t>(m, t);
  for (uint32_t t : wide_) m = std::max(m, t);
  return m;
}

absl::Status WriteTokenShard(const std::string& path, const std::vector<uint16_t>& tokens) {
  return WriteShard(path, kShardVersion, tokens);
}

absl::Status WriteTokenShard(const std::string& path, const std::vector<uint32_t>& tokens) {
  return WriteShard(path, kShardVersionWide, tokens);
}

absl::StatusOr<TokenShard> ReadTokenShard(const std::string& path) {
  if (absl::Status s = CheckRegularFile(path); !s.ok()) {
    const bool directory = std::filesystem::is_directory(path);
    return absl::InvalidArgumentError(absl::StrCat(
        s.message(), directory ? absl::StrCat(": give its shards, e.g. \"", path, "/*.bin\"")
                               : ": a token shard must be a file on disk"));
  }
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return absl::NotFoundError(absl::StrFormat("%s: cannot open token shard", path));
  const int64_t size = in.tellg();
  in.seekg(0);
  int32_t header[256];
  if (size < static_cast<int64_t>(sizeof(header)) ||
      !in.read(reinterpret_cast<char*>(header), sizeof(header))) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: truncated: shorter than the 1024-byte shard header", path));
  }
  if (header[0] != kShardMagic) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: not an llm.c token shard: magic %d, expected %d", path, header[0], kShardMagic));
  }
  if (header[1] != kShardVersion && header[1] != kShardVersionWide) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: token shard version %d is not supported (1: uint16 tokens, 2: uint32 are)", path,
        header[1]));
  }
  const int64_t n = header[2];
  const int64_t width = header[1] == kShardVersionWide ? 4 : 2;
  if (n < 0 || size != static_cast<int64_t>(sizeof(header)) + width * n) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: header says %d tokens (%d bytes with the header) but the file has %d bytes%s", path, n,
        1024 + width * n, size, size < 1024 + width * n ? " (truncated)" : ""));
  }
  auto read = [&](auto tokens) -> absl::StatusOr<TokenShard> {
    in.read(reinterpret_cast<char*>(tokens.data()), width * n);
    if (!in) return absl::DataLossError(absl::StrFormat("%s: read failed", path));
    return TokenShard(std::move(tokens));
  };
  if (width == 4) return read(std::vector<uint32_t>(n));
  return read(std::vector<uint16_t>(n));
}

absl::StatusOr<std::vector<std::string>> ExpandGlob(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> paths;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) paths.emplace_back(g.gl_pathv[i]);
  }
  globfree(&g);
  if (paths.empty()) {
    return absl::NotFoundError(absl::StrFormat(
        "no token shards match '%s' (prepare data first: launch/prepare_data.sh)", pattern));
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

absl::StatusOr<TokenLoader> TokenLoader::Open(const std::string& pattern, int64_t B, int64_t T,
                                              bool shuffle, uint64_t seed) {
  absl::StatusOr<std::vector<std::string>> files = ExpandGlob(pattern);
  if (!files.ok()) return files.status();
  TokenLoader loader;
  loader.B_ = B;
  loader.T_ = T;
  loader.shuffle_ = shuffle;
  loader.seed_ = seed;
  for (const std::string& file : *files) {
    absl::StatusOr<TokenShard> tokens = ReadTokenShard(file);
    if (!tokens.ok()) return tokens.status();
    if (tokens->size() < B * T + 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: %d tokens, but one batch of %d × %d needs %d: use a shorter train.seq_len or "
          "batch, or more text",
          file, tokens->size(), B, T, B * T + 1));
    }
    loader.total_tokens_ += static_cast<int64_t>(tokens->size());
    // Ids past int32 are kept as the largest int32: any model refuses them by vocabulary.
    loader.max_token_ = std::max<int32_t>(
        loader.max_token_, static_cast<int32_t>(std::min<uint32_t>(
                               tokens->max_token(), std::numeric_limits<int32_t>::max())));
    loader.shards_.push_back(*std::move(tokens));
    loader.files_.push_back(file);
  }
  loader.PrepareEpoch();
  return loader;
}

int64_t TokenLoader::WindowsIn(int64_t f) const { return (shards_[f].size() - 1) / (B_ * T_); }

int64_t TokenLoader::batches_per_epoch() const {
  int64_t n = 0;
  for (size_t f = 0; f < shards_.size(); ++f) n += WindowsIn(static_cast<int64_t>(f));
  return n;
}

void TokenLoader::PrepareEpoch() {
  const int64_t files = static_cast<int64_t>(shards_.size());
  shard_order_.resize(files);
  std::iota(shard_order_.begin(), shard_order_.end(), 0);
  window_order_.assign(files, {});
  for (int64_t f = 0; f < files; ++f) {
    window_order_[f].resize(WindowsIn(f));
    std::iota(window_order_[f].begin(), window_order_[f].end(), 0);
  }
  if (!shuffle_) return;
  std::seed_seq seq{seed_, static_cast<uint64_t>(position_.epoch)};
  std::mt19937_64 rng(seq);
  std::shuffle(shard_order_.begin(), shard_order_.end(), rng);
  for (auto& order : window_order_) std::shuffle(order.begin(), order.end(), rng);
}

void TokenLoader::Seek(const LoaderPosition& position) {
  const bool new_epoch = position.epoch != position_.epoch;
  position_ = position;
  if (new_epoch || shard_order_.empty()) PrepareEpoch();
}

void TokenLoader::Next(int32_t* inputs, int32_t* targets) {
  const int64_t f = shard_order_[position_.shard];
  const int64_t start = window_order_[f][position_.window] * B_ * T_;
  const TokenShard& tokens = shards_[f];
  for (int64_t i = 0; i < B_ * T_; ++i) {
    inputs[i] = static_cast<int32_t>(tokens[start + i]);
    targets[i] = static_cast<int32_t>(tokens[start + i + 1]);
  }
  if (++position_.window == WindowsIn(f)) {
    position_.window = 0;
    if (++position_.shard == static_cast<int64_t>(shards_.size())) {
      position_.shard = 0;
      ++position_.epoch;
      PrepareEpoch();
    }
  }
}

}  // namespace freeride
