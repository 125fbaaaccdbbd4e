// A tiny training run for trainer tests: a random token shard, a 2-layer model's config,
// and helpers that fail the test with the status when a step or a parse fails.
#pragma once

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "trainer/data/token_shards.h"
#include "trainer/trainer.h"

namespace freeride {

inline std::string Temp(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) / name).string();
}

inline StepStats MustStep(Trainer& trainer) {
  absl::StatusOr<StepStats> s = trainer.Step();
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : StepStats{};
}

inline Config MustParse(const std::string& toml, const std::vector<std::string>& overrides = {}) {
  auto config = ParseConfig(toml, "test.toml", overrides);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : Config{};
}

// A token shard of `tokens` random ids below `vocab`, in the test's temporary directory.
inline std::string WriteRandomShard(const std::string& name, int tokens, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> ids(tokens);
  for (auto& t : ids) t = static_cast<uint16_t>(rng() % vocab);
  const std::string path = Temp(name);
  EXPECT_TRUE(WriteTokenShard(path, ids).ok());
  return path;
}

inline std::string TinyToml(const std::string& train, const std::string& dir) {
  return absl::StrFormat(R"(
[run]
dir = "%s"
seed = 5
[model]
n_layer = 2
n_head = 2
n_embd = 32
max_seq_len = 16
vocab_size = 64
[data]
train = "%s"
[train]
batch_size = 4
seq_len = 16
microbatches = 2
steps = 6
[optim]
lr = 1e-2
warmup_steps = 0
)", dir, train);
}

}  // namespace freeride
