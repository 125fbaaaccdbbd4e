// The data-parallel sum in buckets (parallel.dp_bucket_mb): the fixed layout, buckets started
// inside the last backward while earlier blocks' gradients are still being made, a bucket
// whose gradients change after its sum began caught, and training bit-identical to the one
// sum per chunk for several bucket sizes, schedule kinds, pp 1, 2 and 4 and both step ends
// (dp = 2, ranks as threads, every bucket checked).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <thread>

#include "gmock/gmock.h"
#include "models/cpu_stage_model.h"
#include "pipeline/grad_buckets.h"
#include "tests/pipeline/train_parity.h"

namespace freeride {
namespace {

using pipeline::GradBucket;
using pipeline::GradBuckets;
using pipeline::LayoutGradBuckets;

GPT2Config TinyModel() {
  absl::StatusOr<GPT2Config> c = MakeGPT2Config(/*n_layer=*/2, /*n_head=*/2, /*n_embd=*/4,
                                                /*max_seq_len=*/8, /*vocab_size=*/16);
  EXPECT_TRUE(c.ok());
  return *c;
}

TEST(GradBucketLayoutTest, TensorsInTheOrderTheBackwardFinishesThem) {
  const GPT2Config cfg = TinyModel();
  const ParamLayout layout = MakeParamLayout(cfg, WholeModel(cfg));
  const int64_t C = cfg.n_embd;
  const std::vector<GradBucket> buckets = LayoutGradBuckets(layout, 6);
  // lnf_b (4) and the first 2 of lnf_w, split at the bucket's end.
  ASSERT_GE(buckets.size(), 2u);
  const auto& lnf_b = layout.slot(ParamTensor::kLnfB);
  const auto& lnf_w = layout.slot(ParamTensor::kLnfW);
  ASSERT_EQ(buckets[0].pieces.size(), 2u);
  EXPECT_EQ(buckets[0].pieces[0].offset, lnf_b.offset);
  EXPECT_EQ(buckets[0].pieces[0].n, C);
  EXPECT_EQ(buckets[0].pieces[1].offset, lnf_w.offset);
  EXPECT_EQ(buckets[0].pieces[1].n, 2);
  EXPECT_EQ(buckets[0].ready_part, 0);
  // Then the rest of lnf_w and the last block's fc_proj_b (layer 1 of 2, part 1).
  const auto& fc_proj_b = layout.slot(ParamTensor::kFcProjB);
  ASSERT_EQ(buckets[1].pieces.size(), 2u);
  EXPECT_EQ(buckets[1].pieces[0].offset, lnf_w.offset + 2);
  EXPECT_EQ(buckets[1].pieces[1].offset, fc_proj_b.offset + C);
  EXPECT_EQ(buckets[1].ready_part, 1);
  // Every element exactly once, buckets full but the last, parts never going back, wte last.
  std::vector<int> seen(layout.total, 0);
  int part = 0;
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (b + 1 < buckets.size()) {
      EXPECT_EQ(buckets[b].floats, 6);
    }
    EXPECT_GE(buckets[b].ready_part, part);
    part = buckets[b].ready_part;
    for (const auto& p : buckets[b].pieces) {
      for (int64_t i = p.offset; i < p.offset + p.n; ++i) ++seen[i];
    }
  }
  EXPECT_THAT(seen, ::testing::Each(1));
  EXPECT_EQ(buckets.back().ready_part, pipeline::TiedPart(layout.stage));
  EXPECT_EQ(buckets.back().pieces.back().offset + buckets.back().pieces.back().n,
            layout.slot(ParamTensor::kWte).offset + layout.slot(ParamTensor::kWte).elements);
  // One bucket when it holds everything.
  EXPECT_EQ(LayoutGradBuckets(layout, layout.total).size(), 1u);
}

// Records, at each bucket's start, whether block 0's gradients (final only after the last
// block's) were still all zero: the start came from inside the backward.
class SpyTransport : public pipeline::Transport {
 public:
  explicit SpyTransport(StageModel* model) : model_(model), self_(pipeline::MakeSelfTransport()) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  // A world of one: the self transport refuses point-to-point (nothing to talk to).
  absl::StatusOr<Request> Isend(const void* d, int64_t bytes, int peer, int tag) override {
    return self_->Isend(d, bytes, peer, tag);
  }
  absl::StatusOr<Request> Irecv(void* d, int64_t bytes, int peer, int tag) override {
    return self_->Irecv(d, bytes, peer, tag);
  }
  absl::Status Wait(Request r, double t) override { return self_->Wait(r, t); }
  bool Test(Request r) override { return self_->Test(r); }
  absl::Status AllReduceSum(float*, int64_t, const std::vector<int>&, double) override {
    return absl::OkStatus();
  }
  absl::Status AllReduceSum(double*, int64_t, const std::vector<int>&, double) override {
    return absl::OkStatus();
  }
  absl::StatusOr<Request> StartAllReduceSum(float* data, int64_t n,
                                            const std::vector<int>& g) override {
    const TensorSlot& qkv = model_->layout().slot(ParamTensor::kQkvW);
    const int64_t per_layer = qkv.elements / model_->stage().num_layers();
    const float* grads = *model_->HostGrads(qkv.offset, per_layer);  // block 0's
    block0_zero.push_back(std::all_of(grads, grads + per_layer, [](float x) { return x == 0; }));
    return self_->StartAllReduceSum(data, n, g);
  }
  absl::StatusOr<Request> StartAllReduceSum(double* data, int64_t n,
                                            const std::vector<int>& g) override {
    return self_->StartAllReduceSum(data, n, g);
  }
  std::vector<bool> block0_zero;

 private:
  StageModel* model_;
  std::unique_ptr<pipeline::Transport> self_;
};

TEST(GradBucketsTest, StartInsideTheLastBackwardAndCatchLateWrites) {
  const GPT2Config cfg = TinyModel();
  CpuStageModel model(cfg, WholeModel(cfg), /*micro_batch=*/1, /*seq_len=*/4, /*slots=*/1);
  ASSERT_TRUE(model.InitRandom(1).ok());
  std::vector<int32_t> tokens = {1, 2, 3, 4}, targets = {2, 3, 4, 5};
  ASSERT_TRUE(model.SetTokens(0, tokens.data()).ok());
  ASSERT_TRUE(model.SetTargets(0, targets.data()).ok());
  ASSERT_TRUE(model.ZeroGrads().ok());
  ASSERT_TRUE(model.Forward(0).ok());
  ASSERT_TRUE(model.BackwardInput(0, 0.25f).ok());
  SpyTransport spy(&model);
  // Buckets of one block's tensors (12·C² + 13·C = 244 floats at C = 4).
  GradBuckets buckets({&model}, 244, &spy, {0, 1});
  buckets.set_verify(true);
  buckets.Reset();
  buckets.BeginLastBackward(0);
  ASSERT_TRUE(model.BackwardWeight(0).ok());
  ASSERT_TRUE(buckets.EndLastBackward(0).ok());
  // lnf and block 1 started while block 0 was still to come; wte's bucket not yet.
  ASSERT_GE(spy.block0_zero.size(), 2u);
  EXPECT_TRUE(spy.block0_zero[0]);
  EXPECT_FALSE(spy.block0_zero.back());
  const size_t before_tied = spy.block0_zero.size();
  ASSERT_TRUE(buckets.StartRemaining().ok());
  EXPECT_GT(spy.block0_zero.size(), before_tied);
  // A write into a started bucket (the first: lnf_b) is caught when it is waited for.
  (*model.HostGrads(model.layout().slot(ParamTensor::kLnfB).offset, 1))[0] += 1.0f;
  absl::Status s = buckets.Finish(10);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("started before its gradients were final"));
}

// Parameters and AdamW moments of every rank, and the losses, as bits; `buckets`: how many
// rank 0's first chunk sums in (0: one sum).
std::vector<uint32_t> TrainBits(const Config& config, int steps, size_t* buckets = nullptr) {
  const int world = static_cast<int>(config.parallel.pp * config.parallel.dp);
  auto transports = pipeline::MakeInProcessWorld(world);
  std::vector<std::vector<uint32_t>> bits(world);
  std::vector<std::string> failures(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto trainer = Trainer::Create(config, transports[r].get());
      if (!trainer.ok()) {
        failures[r] = std::string(trainer.status().message());
        return;
      }
      (*trainer)->executor().set_verify_buckets(true);
      if (r == 0 && buckets != nullptr) {
        const pipeline::GradBuckets* b = (*trainer)->executor().buckets();
        *buckets = b == nullptr ? 0 : b->buckets(0).size();
      }
      for (int i = 0; i < steps; ++i) {
        absl::StatusOr<StepStats> s = (*trainer)->Step();
        if (!s.ok()) {
          failures[r] = std::string(s.status().message());
          return;
        }
        const uint64_t loss = std::bit_cast<uint64_t>(s->loss);
        bits[r].push_back(static_cast<uint32_t>(loss));
        bits[r].push_back(static_cast<uint32_t>(loss >> 32));
      }
      for (int c = 0; c < (*trainer)->num_chunks(); ++c) {
        StageModel& chunk = (*trainer)->model(c);
        std::vector<float> p(chunk.num_params()), m(p.size()), v(p.size());
        EXPECT_TRUE(chunk.GetParams(p.data()).ok());
        EXPECT_TRUE(chunk.GetOptimizerState(m.data(), v.data()).ok());
        for (const auto* part : {&p, &m, &v}) {
          for (float x : *part) bits[r].push_back(std::bit_cast<uint32_t>(x));
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<uint32_t> all;
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(failures[r], "") << "rank " << r;
    all.insert(all.end(), bits[r].begin(), bits[r].end());
  }
  return all;
}

class DpBucketsTrainTest : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
 protected:
  static void SetUpTestSuite() {
    openblas_set_num_threads(1);  // the ranks are already threads
    omp_set_num_threads(1);
  }
};

// MiB: 64 floats (many buckets, tensors split), 1000 floats (wte split, blocks shared), one
// bucket per chunk.
TEST_P(DpBucketsTrainTest, BitIdenticalToOneSumPerChunk) {
  const auto& [kind, sync] = GetParam();
  const std::string shard = testing::ParityShard();
  // pp 1 (1F1B only: one stage holds embedding and head, the tied fold at REDUCE_GRADS).
  std::vector<int> pps = {2, 4};
  if (kind == "1f1b") pps.insert(pps.begin(), 1);
  for (int pp : pps) {
    Config config = testing::ParityConfig(shard, kind, pp, /*dp=*/2, 8);
    config.parallel.partition = "even";  // the same split in every run
    config.optim.step_sync = sync;
    config.optim.grad_clip = 0.36;  // some steps clip (post-validated: rolled back, redone)
    const std::vector<uint32_t> whole = TrainBits(config, 4);
    for (double mib : {64 * 4.0 / (1 << 20), 1000 * 4.0 / (1 << 20), 1.0}) {
      SCOPED_TRACE(absl::StrFormat("%s pp=%d dp=2 %s dp_bucket_mb=%g", kind, pp, sync, mib));
      config.parallel.dp_bucket_mb = mib;
      size_t buckets = 0;
      EXPECT_TRUE(TrainBits(config, 4, &buckets) == whole);
      // Stage 0's chunk 0 holds wte (128 × 16) and a block (3,344) or more.
      if (mib == 1.0) {
        EXPECT_EQ(buckets, 1u);
      } else {
        EXPECT_GT(buckets, mib < 1e-3 ? 50u : 3u);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, DpBucketsTrainTest,
                         ::testing::Combine(::testing::Values("1f1b", "interleaved", "zbh1", "zbv"),
                                            ::testing::Values("barrier", "post_validate")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

}  // namespace
}  // namespace freeride
