// Shared by the in-process and MPI pipeline-training tests: a tiny run's config and the
// losses of the single-process trainer, the reference every pipeline layout must reproduce.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "pipeline/comm/transport.h"
#include "trainer/data/token_shards.h"
#include "trainer/trainer.h"

namespace freeride::testing {

inline std::string ParityShard() {
  const std::string path =
      (std::filesystem::path(::testing::TempDir()) / "parity_tokens.bin").string();
  std::mt19937 rng(17);
  std::vector<uint16_t> ids(20000);
  for (auto& t : ids) t = static_cast<uint16_t>(rng() % 64);
  EXPECT_TRUE(WriteTokenShard(path, ids).ok());
  return path;
}

// 8 layers so that 4 stages × 2 chunks fit; batch 8 so that 8 micro-batches fit.
inline Config ParityConfig(const std::string& shard, const std::string& schedule, int pp, int dp,
                           int microbatches, int batch = 8, const std::string& dir = "") {
  const std::string toml = absl::StrFormat(R"(
[run]
dir = "%s"
seed = 3
[model]
n_layer = 8
n_head = 2
n_embd = 16
max_seq_len = 8
vocab_size = 64
[data]
train = "%s"
shuffle = true
[train]
batch_size = %d
seq_len = 8
microbatches = %d
steps = 5
[optim]
lr = 1e-2
warmup_steps = 2
[parallel]
pp = %d
dp = %d
schedule = "%s"
chunks = %d
)", dir.empty() ? (std::filesystem::path(::testing::TempDir()) / "parity_run").string() : dir,
      shard, batch, microbatches, pp, dp, schedule, schedule == "interleaved" ? 2 : 1);
  auto config = ParseConfig(toml, "parity.toml");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : Config{};
}

// ParityConfig's run as a Llama-family model: 2 query heads sharing 1 key/value head, the head
// tied to the embedding or not.
inline Config LlamaParityConfig(const std::string& shard, const std::string& schedule, int pp,
                                int dp, int microbatches, bool tied, int batch = 8) {
  Config config = ParityConfig(shard, schedule, pp, dp, microbatches, batch);
  config.model.arch = "llama";
  config.model.n_kv_head = 1;
  config.model.ffn_hidden = 24;
  config.model.rope_theta = 500.0;
  config.model.tie_embeddings = tied;
  return config;
}

// Losses of `steps` steps of `config` run by one process.
// The tiny 2-stage 1F1B run with stage 0 real and stage 1 emulated, harvesting on (no tasks
// yet): a heavier last stage (vocabulary 8192) gives stage 0 real bubbles.
inline Config EmulatedHarvestConfig(const std::string& dir) {
  Config config = ParityConfig(ParityShard(), "1f1b", 2, 1, 4);
  config.model.vocab_size = 8192;
  config.runtime.emulate_peers = true;
  config.freeride.enabled = true;
  config.freeride.calibration_steps = 1;
  // One thread: the real compute behind each step (simulated time or not) does not wait at
  // OpenMP barriers for a thread that a loaded machine has descheduled.
  config.runtime.threads = 1;
  config.run.dir = (std::filesystem::path(::testing::TempDir()) / dir).string();
  return config;
}

inline std::vector<double> SingleProcessLosses(const Config& config, int steps = 5) {
  auto trainer = Trainer::Create(config);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  std::vector<double> losses;
  if (!trainer.ok()) return losses;
  for (int i = 0; i < steps; ++i) {
    auto s = (*trainer)->Step();
    EXPECT_TRUE(s.ok()) << s.status();
    losses.push_back(s.ok() ? s->loss : NAN);
  }
  return losses;
}

// Makes a rank's transport over its in-process one (on the rank's own thread: a collective).
using TransportOver = std::function<absl::StatusOr<std::unique_ptr<pipeline::Transport>>(
    pipeline::Transport& in_process)>;

// Runs `config` on pp × dp threads; returns rank 0's losses (every rank sees the same). With
// `over`, each rank trains on the transport it makes over the in-process one.
inline std::vector<double> ThreadedLosses(const Config& config, int steps = 5,
                                          std::vector<std::string>* errors = nullptr,
                                          int resume_at = -1, const TransportOver& over = nullptr) {
  const int world = static_cast<int>(config.parallel.pp * config.parallel.dp);
  auto transports = pipeline::MakeInProcessWorld(world);
  std::vector<std::vector<double>> losses(world);
  std::vector<std::string> failures(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<pipeline::Transport> wrapped;
      if (over) {
        auto made = over(*transports[r]);
        if (!made.ok()) {
          failures[r] = std::string(made.status().message());
          return;
        }
        wrapped = *std::move(made);
      }
      auto trainer = Trainer::Create(config, over ? wrapped.get() : transports[r].get());
      if (!trainer.ok()) {
        failures[r] = std::string(trainer.status().message());
        return;
      }
      for (int i = 0; i < steps; ++i) {
        auto s = (*trainer)->Step();
        if (!s.ok()) {
          failures[r] = std::string(s.status().message());
          return;
        }
        losses[r].push_back(s->loss);
        if (i + 1 == resume_at) {
          auto dir = (*trainer)->SaveCheckpoint();
          if (!dir.ok()) failures[r] = std::string(dir.status().message());
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    if (errors != nullptr) {
      errors->push_back(failures[r]);
    } else {
      EXPECT_EQ(failures[r], "") << "rank " << r;
    }
    if (r > 0 && errors == nullptr) {
      EXPECT_EQ(losses[r], losses[0]) << "rank " << r;
    }
  }
  return losses[0];
}

}  // namespace freeride::testing
