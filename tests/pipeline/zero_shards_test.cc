// ZeRO-1's pieces on their own: the reduce-scatter and all-gather of the in-process transport
// (the sum's bits in rank order, each part at its place), the split of a stage into shares
// (whole norm chunks, the stream covered once), what a sharded chunk holds (bytes, closed
// form), and `config memory`'s moments per rank (closed form).
#include <bit>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/host_memory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/backend.h"
#include "models/cuda/multi_tensor_table.h"
#include "pipeline/grad_buckets.h"
#include "trainer/memory_report.h"
#include "trainer/trainer.h"

namespace freeride {
namespace {

using ::testing::HasSubstr;

// Three ranks as threads, each running `body(rank, transport)`.
void OnThreeRanks(
    const std::function<void(int, pipeline::Transport&, const std::vector<int>&)>& body) {
  auto world = pipeline::MakeInProcessWorld(3);
  const std::vector<int> group = {0, 1, 2};
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) threads.emplace_back([&, r] { body(r, *world[r], group); });
  for (auto& t : threads) t.join();
}

TEST(ZeroTransportTest, ReduceScatterSumsInRankOrderAndLeavesEachItsPart) {
  // Values whose sum depends on the order: (1e8 + 1) - 1e8 is 0 in float, 1e8 - 1e8 + 1 is 1.
  const std::vector<std::vector<float>> values = {
      {1e8f, 1e8f, 3, 4, 5}, {1, -1e8f, 6, 7, 8}, {-1e8f, 1, 9, 10, -0.0f}};
  const std::vector<int64_t> counts = {2, 0, 3};
  std::vector<std::vector<float>> scattered(3), summed(3);
  OnThreeRanks([&](int r, pipeline::Transport& t, const std::vector<int>& group) {
    scattered[r] = summed[r] = values[r];
    auto request = t.StartReduceScatterSum(scattered[r].data(), counts, group);
    ASSERT_TRUE(request.ok()) << request.status();
    ASSERT_TRUE(t.Wait(*request, 60).ok());
    ASSERT_TRUE(t.AllReduceSum(summed[r].data(), 5, group, 60).ok());
  });
  EXPECT_EQ(summed[0][0], 0.0f);  // rank order: (1e8 + 1) - 1e8
  EXPECT_EQ(summed[0][1], 1.0f);  // (1e8 - 1e8) + 1
  // Rank 0 holds elements [0, 2) of the sum, rank 2 [2, 5), bit for bit the all-reduce's.
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(scattered[0][i]), std::bit_cast<uint32_t>(summed[0][i]));
  }
  for (int i = 2; i < 5; ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(scattered[2][i]), std::bit_cast<uint32_t>(summed[0][i]));
  }
  EXPECT_EQ(scattered[1], values[1]);  // an empty part: nothing of the sum lands there
}

TEST(ZeroTransportTest, AllGatherCopiesEachPartBitForBit) {
  const std::vector<int64_t> counts = {1, 3, 2};
  // Each rank's own part is its place's values; the rest is rubbish the gather overwrites.
  const std::vector<float> whole = {-0.0f, 1.5f, -2.25f, 1e-40f, 7, 8};
  std::vector<std::vector<float>> got(3);
  OnThreeRanks([&](int r, pipeline::Transport& t, const std::vector<int>& group) {
    got[r].assign(6, static_cast<float>(100 + r));
    const int64_t from = r == 0 ? 0 : r == 1 ? 1 : 4;
    for (int64_t i = from; i < from + counts[r]; ++i) got[r][i] = whole[i];
    auto request = t.StartAllGather(got[r].data(), counts, group);
    ASSERT_TRUE(request.ok()) << request.status();
    ASSERT_TRUE(t.Wait(*request, 60).ok());
  });
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 6; ++i) {
      EXPECT_EQ(std::bit_cast<uint32_t>(got[r][i]), std::bit_cast<uint32_t>(whole[i]))
          << "rank " << r << " element " << i;  // -0.0 and a subnormal keep their bits
    }
  }
}

// A middle stage of GPT-2 (no embedding, no head) of L blocks: its stream is whole blocks, each
// 12·C² + 13·C parameters, so shares of L / dp blocks each are exact.
int64_t BlockParams(int64_t C) { return 12 * C * C + 13 * C; }

TEST(ZeroSplitTest, SharesKeepNormChunksWholeAndCoverTheStageOnce) {
  absl::StatusOr<GPT2Config> config = MakeGPT2Config(8, 2, 96, 64, 1000);
  ASSERT_TRUE(config.ok()) << config.status();
  for (const StageSpec& spec : {StageSpec{0, 3, true, false}, StageSpec{3, 8, false, true}}) {
    const ParamLayout layout = MakeParamLayout(*config, spec);
    for (int dp : {2, 3, 4}) {
      SCOPED_TRACE(
          absl::StrFormat("layers [%d, %d), dp %d", spec.first_layer, spec.last_layer, dp));
      const pipeline::ZeroSplit split = pipeline::SplitForZero(layout, 5000, dp);
      std::vector<int> holders(layout.total, 0);
      for (int r = 0; r < dp; ++r) {
        int64_t held = 0;
        for (const ParamRange& range : split.owned[r]) {
          EXPECT_TRUE(TensorAt(layout, range).ok());
          for (int64_t i = range.offset; i < range.offset + range.n; ++i) ++holders[i];
          held += range.n;
        }
        EXPECT_EQ(held, split.bounds[r + 1] - split.bounds[r]);
        // Near 1/dp: within the largest slice (every slice is below one norm chunk here).
        EXPECT_NEAR(static_cast<double>(split.bounds[r + 1]),
                    static_cast<double>(layout.total) * (r + 1) / dp, 1000.0 * 96 + 1);
      }
      for (int64_t i = 0; i < layout.total; ++i) ASSERT_EQ(holders[i], 1) << "element " << i;
      // Each bucket's parts add up to it, in member order.
      for (size_t k = 0; k < split.buckets.size(); ++k) {
        int64_t sum = 0;
        for (int64_t c : split.counts[k]) sum += c;
        EXPECT_EQ(sum, split.buckets[k].floats);
      }
      // Every norm chunk lies in one rank's share: a chunk sum of the shares' is the whole's.
      std::vector<double> partials(PlanGradNorm(layout).chunks, -1);
      const BackendOptions cpu;
      auto chunk = MakeStageModel(cpu, *config, spec, 1, 4, 1);
      ASSERT_TRUE(chunk.ok());
      for (int r = 0; r < dp; ++r) {
        ASSERT_TRUE((*chunk)->ShardGradSquares(split.owned[r], partials.data()).ok());
      }
      for (double p : partials) EXPECT_EQ(p, 0.0);  // zero gradients: every chunk was made
    }
  }
}

TEST(ZeroSplitTest, AShardedChunkHoldsOnlyItsShareOfTheMoments) {
  const int64_t C = 32, L = 4;
  absl::StatusOr<GPT2Config> config = MakeGPT2Config(8, 2, C, 16, 100);
  ASSERT_TRUE(config.ok()) << config.status();
  const StageSpec middle{2, 2 + L, false, false};
  const ParamLayout layout = MakeParamLayout(*config, middle);
  ASSERT_EQ(layout.total, L * BlockParams(C));
  for (int dp : {1, 2, 4}) {
    const pipeline::ZeroSplit split = pipeline::SplitForZero(layout, 1024, dp);
    for (int r = 0; r < dp; ++r) {
      SCOPED_TRACE(absl::StrFormat("dp %d rank %d", dp, r));
      auto chunk = MakeStageModel(BackendOptions{}, *config, middle, 1, 4, 1);
      ASSERT_TRUE(chunk.ok());
      // Nothing before the moments are needed (a chunk sharded at start never holds them
      // whole), a whole chunk's when they are.
      EXPECT_EQ((*chunk)->OptimizerStateBytes(), 0);
      if (r == 0) {
        auto whole = MakeStageModel(BackendOptions{}, *config, middle, 1, 4, 1);
        ASSERT_TRUE(whole.ok());
        std::vector<float> m(layout.total), v(layout.total);
        ASSERT_TRUE((*whole)->GetOptimizerState(m.data(), v.data()).ok());
        EXPECT_EQ((*whole)->OptimizerStateBytes(), 2 * 4 * layout.total);
      }
      ASSERT_TRUE((*chunk)->ShardOptimizerState(split.owned[r]).ok());
      // L / dp blocks of moments m and v, 4 bytes each.
      EXPECT_EQ((*chunk)->OptimizerStateBytes(), 2 * 4 * (L / dp) * BlockParams(C));
      EXPECT_EQ((*chunk)->OptimizerStateElements(), (L / dp) * BlockParams(C));
      EXPECT_EQ(ZeroShareElements(*config, middle, dp, r), (L / dp) * BlockParams(C));
      EXPECT_FALSE((*chunk)->ShardOptimizerState(split.owned[r]).ok());  // once
    }
  }
  // A range across two tensors is refused.
  auto chunk = MakeStageModel(BackendOptions{}, *config, middle, 1, 4, 1);
  ASSERT_TRUE(chunk.ok());
  const TensorSlot& ln1 = layout.slot(ParamTensor::kLn1W);
  EXPECT_FALSE((*chunk)->ShardOptimizerState({{ln1.offset, ln1.elements + 1}}).ok());
}

// `freeride config memory` counts a rank's share: GPT-2 124M's shape over 3 stages of 4 blocks,
// dp 2: the middle stage's ranks hold 2 blocks' moments each, 8 · 2 · (12·768² + 13·768) bytes.
TEST(ZeroSplitTest, ConfigMemoryShowsTheMomentsPerRank) {
  absl::StatusOr<Config> config =
      LoadConfigFile("configs/gpt2_124m.toml", {"parallel.pp=3", "parallel.dp=2", "parallel.zero=1",
                                                "parallel.layers_per_stage=[4, 4, 4]",
                                                "train.batch_size=4", "train.microbatches=4"});
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::string> report = HostMemoryReport(*config);
  ASSERT_TRUE(report.ok()) << report.status();
  const std::vector<std::string> lines = absl::StrSplit(*report, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u) << *report;
  const int64_t share = 8 * 2 * BlockParams(768);
  EXPECT_THAT(lines[2], HasSubstr(absl::StrFormat(
                            "AdamW moments %s per rank (ZeRO-1: the largest of 2 shares; all "
                            "of them: %s)",
                            FormatBytes(share), FormatBytes(2 * share))));
  config->parallel.zero = 0;
  report = HostMemoryReport(*config);
  ASSERT_TRUE(report.ok());
  EXPECT_THAT(*report,
              HasSubstr(absl::StrFormat("AdamW moments %s per rank; ", FormatBytes(2 * share))));
}

// On CUDA in bf16, `config memory`'s device lines count ZeRO-1's fp32 master by the share too:
// the same split, the middle stage's parameters phase is its 4 blocks' bf16 weights only, and
// its optimizer phase the fp32 master, m and v of 2 blocks (and the share's AdamW table).
TEST(ZeroSplitTest, ConfigMemoryShowsTheMastersShareOnCudaInBf16) {
  absl::StatusOr<Config> config =
      LoadConfigFile("configs/gpt2_124m.toml",
                     {"parallel.pp=3", "parallel.dp=2", "parallel.zero=1",
                      "parallel.layers_per_stage=[4, 4, 4]", "train.batch_size=4",
                      "train.microbatches=4", "runtime.device=cuda", "runtime.precision=bf16"});
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::string> report = DeviceMemoryReport(*config);
  ASSERT_TRUE(report.ok()) << report.status();
  const std::vector<std::string> lines = absl::StrSplit(*report, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u) << *report;
  EXPECT_THAT(lines[0], HasSubstr("ZeRO-1: the AdamW moments and fp32 master copy (in the "
                                  "optimizer phase) of the rank with the stage's largest share"));
  const auto aligned = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  const auto mib = [](int64_t bytes) {
    return absl::StrFormat("%.1f MiB", bytes / double(1 << 20));
  };
  const int64_t whole = 4 * BlockParams(768), share = 2 * BlockParams(768);
  const GPT2Config model = *ResolveModelConfig(*config);
  const StageSpec middle{4, 8, false, false};
  ASSERT_EQ(MakeParamLayout(model, middle).total, whole);
  const int64_t table = CudaOptimizerShare(*config, model, middle, 0).table_chunks;
  ASSERT_EQ(CudaOptimizerShare(*config, model, middle, 0).elements, share);
  EXPECT_THAT(lines[2], HasSubstr(absl::StrCat("parameters ", mib(aligned(whole * 2)))));
  EXPECT_THAT(
      lines[2],
      HasSubstr(absl::StrCat(
          "optimizer ", mib(3 * aligned(share * 4) +
                            aligned(table * static_cast<int64_t>(sizeof(cuda::TensorChunk)))))));
  config->parallel.zero = 0;
  report = DeviceMemoryReport(*config);
  ASSERT_TRUE(report.ok());
  EXPECT_THAT(*report,
              HasSubstr(absl::StrCat("parameters ", mib(aligned(whole * 4) + aligned(whole * 2)))));
}

}  // namespace
}  // namespace freeride
