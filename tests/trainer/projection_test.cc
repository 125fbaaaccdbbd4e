// The scale projection on cases with closed forms: the α–β all-reduce formulas, dp = 1 giving
// exactly the simulator's pipeline, 1F1B's bubble (p−1)/(m+p−1) at 8,192 GPUs with uniform
// costs, the tied-embedding sum over the stage link, and the executor's packing rule (no
// in-process step fits: nothing; a worker: the bubble less its margin, sync waits left out);
// post-validated steps and the all-reduce in buckets as the simulator times them; bf16
// messages at 2 bytes a value; a Llama's parts weighed by its own FLOPs and its untied head
// summed with nobody.
#include "trainer/study/projection.h"

#include "gtest/gtest.h"
#include "pipeline/generators.h"
#include "pipeline/simulator.h"

namespace freeride {
namespace {

using pipeline::AllReduceAlgorithm;
using pipeline::ScheduleKind;

TEST(NetworkTest, AllReduceFollowsTheRingAndTreeFormulas) {
  const pipeline::Network net{10, 10};  // 10 µs, 10 GB/s
  // Ring, 4 ranks, 1 GB: 2·3·0.01 ms + 2·(3/4)·100 ms.
  EXPECT_NEAR(pipeline::AllReduceMs(AllReduceAlgorithm::kRing, net, 1e9, 4), 0.06 + 150, 1e-9);
  // Tree, 4 ranks: 2·log2(4)·0.01 ms + 2·100 ms; 5 ranks: depth ⌈log2 5⌉ = 3.
  EXPECT_NEAR(pipeline::AllReduceMs(AllReduceAlgorithm::kTree, net, 1e9, 4), 0.04 + 200, 1e-9);
  EXPECT_NEAR(pipeline::AllReduceMs(AllReduceAlgorithm::kTree, net, 1e9, 5), 0.06 + 200, 1e-9);
  EXPECT_EQ(pipeline::AllReduceMs(AllReduceAlgorithm::kRing, net, 1e9, 1), 0);
  EXPECT_NEAR(pipeline::PointToPointMs(net, 1e6), 0.01 + 0.1, 1e-12);
  EXPECT_FALSE(pipeline::ParseAllReduceAlgorithm("mesh").ok());
}

GPT2Config Model(int64_t layers) {
  absl::StatusOr<GPT2Config> model = MakeGPT2Config(layers, 2, 32, 64, 64);
  EXPECT_TRUE(model.ok()) << model.status();
  return *model;
}

// Blocks of 6 ms (F = B = W = 2), nothing else, and free communication.
ProjectionOptions Uniform(std::vector<int64_t> gpus, int64_t global_batch) {
  ProjectionOptions o;
  o.gpus = std::move(gpus);
  o.global_batch = global_batch;
  o.micro_batch = 1;
  o.seq_len = 64;
  o.kinds = {ScheduleKind::k1F1B};
  o.costs = PartCosts{0, 6, 0};
  o.link = {0, 1e12};
  o.network = {0, 1e12};
  return o;
}

const ProjectionRow* Row(const Projection& p, int64_t gpus, int64_t pp) {
  for (const ProjectionRow& r : p.rows) {
    if (r.gpus == gpus && r.pp == pp) return &r;
  }
  return nullptr;
}

TEST(ProjectionTest, OneReplicaIsTheSimulatedPipeline) {
  absl::StatusOr<Projection> p = Project(Model(8), Uniform({4}, 8));
  ASSERT_TRUE(p.ok()) << p.status();
  const ProjectionRow* row = Row(*p, 4, 4);
  ASSERT_NE(row, nullptr);
  EXPECT_EQ(row->dp, 1);
  EXPECT_EQ(row->microbatches, 8);
  pipeline::ScheduleOptions options;
  options.kind = ScheduleKind::k1F1B;
  options.stages = 4;
  options.microbatches = 8;
  options.cost = pipeline::CostModel::Uniform(4, 4, 4);  // two blocks per stage
  absl::StatusOr<pipeline::Schedule> schedule = pipeline::BuildSchedule(options);
  ASSERT_TRUE(schedule.ok());
  absl::StatusOr<pipeline::SimResult> sim = pipeline::Simulate(*schedule, options.cost);
  ASSERT_TRUE(sim.ok());
  EXPECT_NEAR(row->step_ms, sim->step_time, 1e-9);
  EXPECT_NEAR(row->bubble_fraction, sim->bubble_fraction, 1e-12);
  EXPECT_EQ(row->allreduce_ms, 0);
  // pp = 2 with dp = 2 (4 micro-batches each) and pp = 1 with dp = 4 fit too; pp = 3 does not.
  EXPECT_NE(Row(*p, 4, 2), nullptr);
  EXPECT_NE(Row(*p, 4, 1), nullptr);
  EXPECT_EQ(Row(*p, 4, 3), nullptr);
}

TEST(ProjectionTest, OneFOneBBubbleAtEightThousandGpus) {
  // pp = 8, dp = 1024, m = 16 384 / 1024 = 16: (p − 1)/(m + p − 1) = 7/23.
  absl::StatusOr<Projection> p = Project(Model(8), Uniform({8192}, 16384));
  ASSERT_TRUE(p.ok()) << p.status();
  const ProjectionRow* row = Row(*p, 8192, 8);
  ASSERT_NE(row, nullptr);
  EXPECT_EQ(row->dp, 1024);
  EXPECT_EQ(row->microbatches, 16);
  EXPECT_NEAR(row->bubble_fraction, 7.0 / 23.0, 1e-6);
  EXPECT_NEAR(row->bubble_gpus(), 8192 * 7.0 / 23.0, 1e-2);
  // Fewer micro-batches per pipeline as replicas grow: pp = 4 at dp = 2048 has m = 8.
  const ProjectionRow* four = Row(*p, 8192, 4);
  ASSERT_NE(four, nullptr);
  EXPECT_NEAR(four->bubble_fraction, 3.0 / 11.0, 1e-6);
}

TEST(ProjectionTest, SideWorkIsPackedByTheExecutorsRule) {
  ProjectionOptions options = Uniform({4}, 8);
  options.tasks = {{"too_long", 1e6, false}};
  absl::StatusOr<Projection> p = Project(Model(8), options);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(Row(*p, 4, 4)->harvested_fraction, 0);  // no step fits any bubble
  options.tasks = {{"worker", 1e6, true}};
  options.margin = 0.1;
  p = Project(Model(8), options);
  ASSERT_TRUE(p.ok());
  const ProjectionRow* row = Row(*p, 4, 4);
  EXPECT_NEAR(row->harvested_fraction, 0.9 * row->bubble_fraction, 1e-12);
  EXPECT_NEAR(row->reclaimed_gpus(), 4 * 0.9 * row->bubble_fraction, 1e-9);
  // Whole steps only: 1 ms steps in bubbles of whole milliseconds less 10% leave ≥ 10% out.
  options.tasks = {{"steps", 1.0, false}};
  p = Project(Model(8), options);
  ASSERT_TRUE(p.ok());
  row = Row(*p, 4, 4);
  EXPECT_GT(row->harvested_fraction, 0);
  EXPECT_LE(row->harvested_fraction, 0.9 * row->bubble_fraction + 1e-12);
}

TEST(ProjectionTest, Bf16MessagesCrossTheLinkAtTwoBytesAValue) {
  // A 1 MB/s link: a message of 64 × 32 values is 8.192 ms in fp32, 4.096 ms in bf16; the
  // weight gradients (the tied sum) stay fp32.
  ProjectionOptions options = Uniform({4}, 8);
  options.link = {0, 1e-3};
  absl::StatusOr<Projection> fp32 = Project(Model(8), options);
  options.message_bytes_per_value = 2;
  absl::StatusOr<Projection> bf16 = Project(Model(8), options);
  ASSERT_TRUE(fp32.ok() && bf16.ok());
  const ProjectionRow *a = Row(*fp32, 4, 4), *b = Row(*bf16, 4, 4);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  // At least the three hops of the first micro-batch's forward are on the critical path.
  EXPECT_GE(a->step_ms - b->step_ms, 3 * 4.096 - 1e-6);
  // One stage, no messages: the same step either way.
  EXPECT_EQ(Row(*fp32, 4, 1)->step_ms, Row(*bf16, 4, 1)->step_ms);
}

TEST(ProjectionTest, TheOptimizerUpdateOfTheLargestRankEndsTheStep) {
  ProjectionOptions options = Uniform({1}, 4);
  absl::StatusOr<Projection> without = Project(Model(8), options);
  options.optimizer_ms_per_param = 1e-3;
  absl::StatusOr<Projection> with = Project(Model(8), options);
  ASSERT_TRUE(without.ok() && with.ok());
  const double params = static_cast<double>(MakeParamLayout(Model(8), StageSpec{0, 8, true, true}).total);
  EXPECT_NEAR(Row(*with, 1, 1)->step_ms - Row(*without, 1, 1)->step_ms, params * 1e-3, 1e-6);
}

TEST(ProjectionTest, TheTiedEmbeddingSumCrossesTheStageLinkAndIsNotHarvested) {
  // The vocabulary matrix is 64 × 32 floats, 8,192 bytes: a 2-rank ring moves bytes/β, 1 ms
  // at 8.192 MB/s. One activation (1 × 64 × 32 floats) is 8,192 bytes too: 1 ms a message.
  ProjectionOptions options = Uniform({2}, 4);
  options.link = {0, 8.192e-3};
  options.tasks = {{"worker", 1e6, true}};
  EXPECT_NEAR(TiedSumMs(Model(8), options), 1.0, 1e-12);
  absl::StatusOr<Projection> p = Project(Model(8), options);
  ASSERT_TRUE(p.ok()) << p.status();
  const ProjectionRow* row = Row(*p, 2, 2);
  ASSERT_NE(row, nullptr);
  pipeline::ScheduleOptions schedule;
  schedule.kind = ScheduleKind::k1F1B;
  schedule.stages = 2;
  schedule.microbatches = 4;
  schedule.cost = pipeline::CostModel::Uniform(8, 8, 8, /*comm=*/1);  // four blocks per stage
  schedule.cost.tied = 1;
  absl::StatusOr<pipeline::Schedule> built = pipeline::BuildSchedule(schedule);
  ASSERT_TRUE(built.ok());
  absl::StatusOr<pipeline::SimResult> sim = pipeline::Simulate(*built, schedule.cost);
  ASSERT_TRUE(sim.ok());
  EXPECT_NEAR(row->step_ms, sim->step_time, 1e-9);
  const double sync = row->bubble_by_kind[static_cast<int>(pipeline::BubbleKind::kSync)];
  EXPECT_GT(sync, 0);
  // The runtime leaves waits for sums inside OPTIMIZER: a worker fills all other bubbles.
  EXPECT_NEAR(row->harvested_fraction, 0.9 * (row->bubble_fraction - sync), 1e-12);
}

// Post-validated, ZB-H2 on even stages (f = b = w = 4 ms, m = 8 ≥ 2p − 1) takes the
// bubble-free 3 × 4 × 8 ms; behind the barrier (p − 1)·f more.
TEST(ProjectionTest, PostValidatedZeroBubbleScheduleTakesItsBubbleFreeStep) {
  ProjectionOptions options = Uniform({4}, 8);
  options.kinds = {ScheduleKind::kZBH2};
  absl::StatusOr<Projection> barrier = Project(Model(8), options);
  options.step_sync = pipeline::StepSync::kPostValidate;
  absl::StatusOr<Projection> post = Project(Model(8), options);
  ASSERT_TRUE(barrier.ok() && post.ok());
  EXPECT_NEAR(Row(*barrier, 4, 4)->step_ms, 96 + 3 * 4, 1e-6);
  EXPECT_NEAR(Row(*post, 4, 4)->step_ms, 96, 1e-6);
  EXPECT_NEAR(Row(*post, 4, 4)->bubble_fraction, 0, 1e-9);
}

// One stage, two replicas (f = b = w = 16 ms, m = 4): the whole all-reduce is exposed after the
// last backward; in buckets (free latency) the last W hides part of it, at most its 16 ms.
TEST(ProjectionTest, BucketedAllReduceHidesBehindTheLastBackward) {
  ProjectionOptions options = Uniform({2}, 8);
  options.network = {0, 1e-4};  // 100 kB/s: an all-reduce far longer than a W
  absl::StatusOr<Projection> whole = Project(Model(8), options);
  options.dp_bucket_mb = 1e-3;
  absl::StatusOr<Projection> buckets = Project(Model(8), options);
  ASSERT_TRUE(whole.ok() && buckets.ok());
  const ProjectionRow* w = Row(*whole, 2, 1);
  const ProjectionRow* b = Row(*buckets, 2, 1);
  ASSERT_NE(w, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NEAR(w->exposed_sync_ms, w->allreduce_ms, 1e-6);
  EXPECT_NEAR(w->step_ms, 4 * 48 + w->allreduce_ms, 1e-6);
  EXPECT_NEAR(b->allreduce_ms, w->allreduce_ms, 1e-6 * w->allreduce_ms);  // no latency
  EXPECT_LT(b->exposed_sync_ms, w->exposed_sync_ms - 15);
  EXPECT_GE(b->exposed_sync_ms, b->allreduce_ms - 16 - 1e-6);
  EXPECT_NEAR(b->step_ms, 4 * 48 + b->exposed_sync_ms, 1e-6);
}

TEST(ProjectionTest, ThePlotHasOneLinePerKindAndAPointPerGpuCount) {
  ProjectionOptions options = Uniform({1024, 2048, 4096}, 16384);
  options.kinds = {ScheduleKind::k1F1B, ScheduleKind::kGPipe};
  absl::StatusOr<Projection> p = Project(Model(8), options);
  ASSERT_TRUE(p.ok());
  const std::string svg = ProjectionSvg(*p);
  auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t at = svg.find(what); at != std::string::npos; at = svg.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("<polyline"), 2u * 2u);  // two kinds, two panels
  EXPECT_EQ(count("<circle"), 2u * 2u * 3u);
  EXPECT_NE(svg.find(">1f1b</text>"), std::string::npos);
  EXPECT_NE(svg.find(">4096</text>"), std::string::npos);
  // With free communication the fastest layout at 1,024 GPUs is pp 1: no bubble, the panel's
  // floor (its top 40 plus its height 200), at the leftmost GPU count.
  EXPECT_NE(svg.find("cx=\"70.0\" cy=\"240.0\""), std::string::npos) << svg;
}

TEST(ProjectionTest, SaysWhyNothingFits) {
  ProjectionOptions options = Uniform({3}, 8);  // 8 is no multiple of dp × 1 for dp = 3
  options.kinds = {ScheduleKind::kGPipe};
  absl::StatusOr<Projection> p = Project(Model(2), options);  // pp ≤ 2 layers: pp = 3 is out
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->rows.empty());
  ASSERT_EQ(p->skipped.size(), 1u);
  EXPECT_NE(p->skipped[0].find("3 GPUs, gpipe: no pp × dp fits"), std::string::npos)
      << p->skipped[0];
}

TEST(ProjectionTest, ALlamaIsWeighedByItsFlopsAndAnUntiedHeadSumsNothing) {
  // 8 layers, C = 32, 4 heads on 2 key/value heads (kv 16), SwiGLU 96, vocabulary 128 at T = 64.
  auto llama = [](bool tied) {
    return *MakeLlamaConfig(8, 4, 2, 32, 64, 128, 96, 1e4, 1e-5, tied);
  };
  const double C = 32, kv = 16, F = 96, T = 64, V = 128;
  const PartCosts flops = FlopPartCosts(llama(true), 64);
  // Forward and backward (×3) of 2 FLOPs per matrix-product parameter and attention's 4·T·C.
  EXPECT_DOUBLE_EQ(flops.block, 3 * (2 * (C * (C + 2 * kv) + C * C + 3 * C * F) + 4 * T * C));
  EXPECT_DOUBLE_EQ(flops.head, 3 * 2 * C * V);

  ProjectionOptions options = Uniform({2}, 4);
  options.link = {0, 8.192e-3};  // a 128 × 32 float matrix, 16,384 bytes: 2 ms over a 2-ring
  EXPECT_NEAR(TiedSumMs(llama(true), options), 2.0, 1e-12);
  EXPECT_EQ(TiedSumMs(llama(false), options), 0);
  absl::StatusOr<Projection> tied = Project(llama(true), options);
  absl::StatusOr<Projection> untied = Project(llama(false), options);
  ASSERT_TRUE(tied.ok() && untied.ok());
  // pp 2 of uniform blocks: the untied run is the tied one less the sum before the update.
  const ProjectionRow* a = Row(*tied, 2, 2);
  const ProjectionRow* b = Row(*untied, 2, 2);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  EXPECT_GT(a->step_ms, b->step_ms);
  pipeline::ScheduleOptions schedule;
  schedule.kind = ScheduleKind::k1F1B;
  schedule.stages = 2;
  schedule.microbatches = 4;
  schedule.cost = pipeline::CostModel::Uniform(8, 8, 8, /*comm=*/1);  // four blocks per stage
  absl::StatusOr<pipeline::Schedule> built = pipeline::BuildSchedule(schedule);
  ASSERT_TRUE(built.ok());
  absl::StatusOr<pipeline::SimResult> sim = pipeline::Simulate(*built, schedule.cost);
  ASSERT_TRUE(sim.ok());
  EXPECT_NEAR(b->step_ms, sim->step_time, 1e-9);
}

}  // namespace
}  // namespace freeride
