// The trainer the training benchmarks time: GPT-2 of a given shape on a shard of random
// tokens in a temporary folder, built from a config like any run's. `extra_toml` adds sections
// ([runtime] device, [optim], ...).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "trainer/data/token_shards.h"
#include "trainer/trainer.h"

namespace freeride {

struct BenchShape {
  int64_t layers = 12, width = 768, heads = 12, batch = 4, seq_len = 64;
  int64_t steps = 1;  // steps the token shard must feed
};

inline absl::StatusOr<std::unique_ptr<Trainer>> MakeBenchTrainer(const std::string& name,
                                                                 const BenchShape& s,
                                                                 const std::string& extra_toml) {
  const std::string dir = (std::filesystem::temp_directory_path() / name).string();
  std::filesystem::create_directories(dir);
  std::mt19937 rng(1);
  std::vector<uint16_t> tokens(s.steps * s.batch * s.seq_len + 1);
  for (auto& t : tokens) t = static_cast<uint16_t>(rng() % 50257);
  if (absl::Status w = WriteTokenShard(dir + "/train.bin", tokens); !w.ok()) return w;
  const std::string toml = absl::StrFormat(R"(
[run]
dir = "%s"
[model]
n_layer = %d
n_head = %d
n_embd = %d
max_seq_len = 1024
[data]
train = "%s/train.bin"
[train]
batch_size = %d
seq_len = %d
steps = %d
%s)", dir, s.layers, s.heads, s.width, dir, s.batch, s.seq_len, s.steps, extra_toml);
  absl::StatusOr<Config> config = ParseConfig(toml, name);
  if (!config.ok()) return config.status();
  return Trainer::Create(*config);
}

}  // namespace freeride
