// ZeRO-1 checkpoints (trainer/moment_shards.h): each data-parallel rank's moments share saved
// in a file of its own (in the foreground and in the background), and a checkpoint resumed
// under another dp (1, 4), pp or zero setting: the moments a rank holds after the resume equal
// the unsharded run's at its places, and training continues with the uninterrupted run's
// losses (bit for bit where dp is unchanged; to rounding where the replicas' sum changes).
#include <cblas.h>
#include <omp.h>

#include <bit>
#include <filesystem>
#include <map>
#include <thread>

#include "core/files.h"
#include "gmock/gmock.h"
#include "tests/pipeline/train_parity.h"
#include "trainer/moment_shards.h"
#include "trainer/train_state.h"

namespace freeride {
namespace {

using testing::ParityConfig;
using testing::ParityShard;

std::string Dir(const std::string& name) {
  const std::string dir = (std::filesystem::path(::testing::TempDir()) / name).string();
  std::filesystem::remove_all(dir);
  return dir;
}

// pp 2 with the same split in every run, dp replicas of 8 / dp sequences (the global batch the
// data position needs), zero as asked, a clip that steps reach.
Config ZeroConfig(const std::string& shard, const std::string& dir, int pp, int dp, int zero) {
  Config config = ParityConfig(shard, "1f1b", pp, dp, 8 / dp / (dp == 4 ? 1 : 2), 8 / dp, dir);
  config.parallel.partition = "even";
  config.parallel.zero = zero;
  config.optim.grad_clip = 0.36;
  return config;
}

struct Resumed {
  std::vector<double> losses;  // rank 0's
  // Per stage: its moments by element of its chunks concatenated, as every rank holding one
  // reported it (each element once per stage when the shares are right).
  std::map<int, std::map<int64_t, std::pair<uint32_t, uint32_t>>> moments;
  std::vector<std::string> failures;
};

// Runs `config` on pp × dp threads for `steps` steps, saving after step `save_at` (in the
// background if asked); the moments every rank holds right after Create (a resume's) are kept.
Resumed RunThreads(const Config& config, int steps, int save_at = -1, bool background = false) {
  const int world = static_cast<int>(config.parallel.pp * config.parallel.dp);
  auto transports = pipeline::MakeInProcessWorld(world);
  Resumed out;
  out.failures.resize(world);
  std::vector<std::vector<double>> losses(world);
  std::vector<std::map<int64_t, std::pair<uint32_t, uint32_t>>> held(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto trainer = Trainer::Create(config, transports[r].get());
      if (!trainer.ok()) {
        out.failures[r] = std::string(trainer.status().message());
        return;
      }
      int64_t stage_offset = 0;
      for (int c = 0; c < (*trainer)->num_chunks(); ++c) {
        StageModel& chunk = (*trainer)->model(c);
        std::vector<float> m(chunk.OptimizerStateElements()), v(m.size());
        EXPECT_TRUE(chunk.GetOptimizerState(m.data(), v.data()).ok());
        const pipeline::StageExecutor& executor = (*trainer)->executor();
        std::vector<ParamRange> places = {{0, chunk.num_params()}};
        if (executor.zero()) places = executor.buckets()->owned(c);
        int64_t at = 0;
        for (const ParamRange& range : places) {
          for (int64_t i = 0; i < range.n; ++i, ++at) {
            held[r][stage_offset + range.offset + i] = {std::bit_cast<uint32_t>(m[at]),
                                                        std::bit_cast<uint32_t>(v[at])};
          }
        }
        stage_offset += chunk.num_params();
      }
      for (int i = 0; i < steps; ++i) {
        auto s = (*trainer)->Step();
        if (!s.ok()) {
          out.failures[r] = std::string(s.status().message());
          return;
        }
        losses[r].push_back(s->loss);
        if (i + 1 == save_at) {
          auto saved = (*trainer)->SaveCheckpoint(background);
          if (!saved.ok()) out.failures[r] = std::string(saved.status().message());
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  out.losses = losses[0];
  for (int r = 0; r < world; ++r) {
    const int stage = r % static_cast<int>(config.parallel.pp);
    // Unsharded replicas each hold the same moments; ZeRO-1 ones each element once.
    const bool sharded = config.parallel.zero == 1 && config.parallel.dp > 1;
    for (const auto& [place, bits] : held[r]) {
      const auto [it, first] = out.moments[stage].emplace(place, bits);
      if (!first) {
        EXPECT_FALSE(sharded) << "stage " << stage << " element " << place << " held twice";
        EXPECT_EQ(it->second, bits) << "stage " << stage << " element " << place;
      }
    }
  }
  return out;
}

// Stage `stage`'s moments in checkpoint `dir` (its state file's, or put together from its
// shares), as element → bits.
std::map<int64_t, std::pair<uint32_t, uint32_t>> SavedMoments(const std::string& dir, int stage) {
  std::map<int64_t, std::pair<uint32_t, uint32_t>> moments;
  absl::StatusOr<RankState> state =
      ReadRankState((std::filesystem::path(dir) / RankStateFileName(stage)).string());
  EXPECT_TRUE(state.ok()) << state.status();
  if (!state.ok()) return moments;
  if (state->moment_shards > 0) {
    EXPECT_TRUE(AssembleStageMoments(dir, &*state).ok());
  }
  for (size_t i = 0; i < state->m.size(); ++i) {
    moments[static_cast<int64_t>(i)] = {std::bit_cast<uint32_t>(state->m[i]),
                                        std::bit_cast<uint32_t>(state->v[i])};
  }
  return moments;
}

class ZeroCheckpointTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    openblas_set_num_threads(1);
    omp_set_num_threads(1);
  }
};

TEST_F(ZeroCheckpointTest, ShardedCheckpointResumesUnderAnotherDpPpOrZero) {
  const std::string shard = ParityShard();
  // The unsharded run, saved at step 2: the moments every resume must hold.
  const std::string whole_dir = Dir("zero_ckpt_whole");
  const Resumed whole = RunThreads(ZeroConfig(shard, whole_dir, 2, 2, 0), 5, 2);
  const std::string whole_ckpt = whole_dir + "/checkpoints/step_00000002";
  ASSERT_TRUE(std::filesystem::exists(whole_ckpt)) << whole_ckpt;
  // The sharded run, saved at step 2 in the background: a share file per rank, the state
  // files with the parameters only, every file in the manifest.
  const std::string dir = Dir("zero_ckpt_sharded");
  const Resumed sharded = RunThreads(ZeroConfig(shard, dir, 2, 2, 1), 5, 2, /*background=*/true);
  EXPECT_EQ(sharded.losses, whole.losses);
  const std::string ckpt = dir + "/checkpoints/step_00000002";
  for (int stage = 0; stage < 2; ++stage) {
    for (int replica = 0; replica < 2; ++replica) {
      EXPECT_TRUE(VerifyCheckpointFile(ckpt, MomentShardFileName(stage, replica)).ok());
    }
    EXPECT_TRUE(VerifyCheckpointFile(ckpt, RankStateFileName(stage)).ok());
    EXPECT_EQ(SavedMoments(ckpt, stage), SavedMoments(whole_ckpt, stage)) << "stage " << stage;
  }
  absl::StatusOr<std::string> manifest = ReadFile(ckpt + "/manifest.json");
  ASSERT_TRUE(manifest.ok());
  EXPECT_THAT(*manifest, ::testing::HasSubstr("\"moment_shards\":2"));

  // Resumed at dp 1, 2 and 4, sharded or not, and at pp 1: the moments are the unsharded
  // run's, and the steps after continue the uninterrupted run.
  for (const auto& [pp, dp, zero] :
       {std::tuple{2, 1, 0}, std::tuple{2, 1, 1}, std::tuple{2, 2, 0}, std::tuple{2, 2, 1},
        std::tuple{2, 4, 1}, std::tuple{1, 2, 1}}) {
    SCOPED_TRACE(absl::StrFormat("resumed at pp=%d dp=%d zero=%d", pp, dp, zero));
    Config to = ZeroConfig(shard, dir, pp, dp, zero);
    to.checkpoint.resume = ckpt;
    to.run.dir = Dir("zero_ckpt_resumed");
    const Resumed resumed = RunThreads(to, 3);
    for (const std::string& failure : resumed.failures) EXPECT_EQ(failure, "");
    if (pp == 2) {
      for (int stage = 0; stage < 2; ++stage) {
        EXPECT_TRUE(resumed.moments.at(stage) == SavedMoments(whole_ckpt, stage))
            << "stage " << stage;
      }
    }
    ASSERT_EQ(resumed.losses.size(), 3u);
    for (int i = 0; i < 3; ++i) {
      if (dp == 2) {
        EXPECT_EQ(resumed.losses[i], whole.losses[2 + i]) << "step " << 3 + i;
      } else {
        EXPECT_NEAR(resumed.losses[i], whole.losses[2 + i], 1e-5) << "step " << 3 + i;
      }
    }
  }
  // And the other way: the unsharded checkpoint resumed sharded.
  Config to = ZeroConfig(shard, whole_dir, 2, 2, 1);
  to.checkpoint.resume = whole_ckpt;
  to.run.dir = Dir("zero_ckpt_resumed");
  const Resumed resumed = RunThreads(to, 3);
  for (int stage = 0; stage < 2; ++stage) {
    EXPECT_TRUE(resumed.moments.at(stage) == SavedMoments(whole_ckpt, stage));
  }
  EXPECT_EQ(resumed.losses, std::vector<double>(whole.losses.begin() + 2, whole.losses.end()));
}

// A share file changed on disk, or gone, is refused by name.
TEST_F(ZeroCheckpointTest, ADamagedOrMissingShareIsRefusedByName) {
  const std::string shard = ParityShard();
  const std::string dir = Dir("zero_ckpt_damaged");
  RunThreads(ZeroConfig(shard, dir, 2, 2, 1), 2, 2);
  const std::string ckpt = dir + "/checkpoints/step_00000002";
  const std::string file = ckpt + "/" + MomentShardFileName(1, 1);
  absl::StatusOr<std::string> bytes = ReadFile(file);
  ASSERT_TRUE(bytes.ok());
  std::string changed = *bytes;
  changed[changed.size() - 1] ^= 1;
  ASSERT_TRUE(WriteFileAtomically(file, changed).ok());
  Config to = ZeroConfig(shard, dir, 2, 1, 0);
  to.checkpoint.resume = ckpt;
  Resumed resumed = RunThreads(to, 0);  // Create only: the rank that resumed whole would wait
  EXPECT_THAT(resumed.failures[1], ::testing::HasSubstr(MomentShardFileName(1, 1)));
  std::filesystem::remove(file);
  resumed = RunThreads(to, 0);
  EXPECT_THAT(resumed.failures[1], ::testing::HasSubstr(MomentShardFileName(1, 1)));
}

}  // namespace
}  // namespace freeride
