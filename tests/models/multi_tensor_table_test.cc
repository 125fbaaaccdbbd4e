// The multi-tensor table (models/cuda/multi_tensor_table.h) over the real parameter layouts of
// the shipped models and their pipeline splits: every element of every tensor in exactly one
// chunk, chunks 16-byte aligned and within one tensor (one layer's), units in model order as
// contiguous ranges, each chunk's weight decay its tensor's; and AdamWElement against float64.
#include "models/cuda/multi_tensor_table.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "models/device_memory_plan.h"
#include "models/gpt2_config.h"

namespace freeride::cuda {
namespace {

GPT2Config Model(int64_t layers, int64_t heads, int64_t embd, int64_t vocab, int64_t max_t) {
  GPT2Config c;
  c.n_layer = layers;
  c.n_head = heads;
  c.n_embd = embd;
  c.vocab_size = vocab;
  c.padded_vocab_size = (vocab + 127) / 128 * 128;
  c.max_seq_len = max_t;
  return c;
}

// configs/gpt2_124m*.toml, tiny_cpu*.toml, freeride_1b_*.toml and its side model.
std::vector<GPT2Config> ShippedModels() {
  return {Model(12, 12, 768, 50257, 1024), Model(4, 4, 128, 50257, 256),
          Model(24, 16, 2048, 50257, 1024), Model(2, 4, 256, 4096, 256)};
}

// The tensor and layer element `i` of the stage's buffer belongs to.
struct Owner {
  ParamTensor tensor;
  int64_t layer;  // -1 for the others
};
Owner OwnerOf(const ParamLayout& layout, int64_t i) {
  for (const TensorSlot& s : layout.slots) {
    if (!s.present || i < s.offset || i >= s.offset + s.elements) continue;
    if (!IsPerLayer(s.tensor)) return {s.tensor, -1};
    return {s.tensor, (i - s.offset) / ParamElements(layout.config, s.tensor)};
  }
  ADD_FAILURE() << "element " << i << " is in no tensor";
  return {ParamTensor::kWte, -2};
}

// The unit StageModel::GradSquaresByUnit counts an owner in (-1: none).
int32_t UnitOf(const StageSpec& st, const Owner& o) {
  const int32_t emb = st.has_embedding ? 1 : 0;
  if (o.tensor == ParamTensor::kWte || o.tensor == ParamTensor::kWpe)
    return st.has_embedding ? 0 : -1;
  if (o.tensor == ParamTensor::kLnfW || o.tensor == ParamTensor::kLnfB) {
    return static_cast<int32_t>(emb + st.num_layers());
  }
  return static_cast<int32_t>(emb + o.layer);
}

void CheckTable(const ParamLayout& layout) {
  SCOPED_TRACE(::testing::Message()
               << "C " << layout.config.n_embd << ", layers [" << layout.stage.first_layer << ", "
               << layout.stage.last_layer << ")");
  const MultiTensorTable t = MakeMultiTensorTable(layout);
  ASSERT_EQ(t.units(), NumGradNormUnits(layout.stage));
  ASSERT_EQ(static_cast<int64_t>(t.chunks.size()), NumTensorChunks(layout));
  // Units: contiguous ranges in order, then only uncounted chunks.
  ASSERT_EQ(t.unit_begin.front(), 0);
  for (int64_t u = 0; u < t.units(); ++u) {
    ASSERT_LT(t.unit_begin[u], t.unit_begin[u + 1]) << "unit " << u << " is empty";
    for (int32_t c = t.unit_begin[u]; c < t.unit_begin[u + 1]; ++c) ASSERT_EQ(t.chunks[c].unit, u);
  }
  for (size_t c = t.counted_chunks(); c < t.chunks.size(); ++c) ASSERT_EQ(t.chunks[c].unit, -1);
  // Each chunk: aligned, bounded, inside one tensor of one layer, of that tensor's unit and
  // decay; together they tile [0, total) exactly once.
  std::vector<TensorChunk> sorted = t.chunks;
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorChunk& a, const TensorChunk& b) { return a.offset < b.offset; });
  int64_t next = 0;
  for (const TensorChunk& c : sorted) {
    ASSERT_EQ(c.offset, next) << "a gap or an overlap";
    ASSERT_GE(c.elements, 1);
    ASSERT_LE(c.elements, kChunkElements);
    ASSERT_EQ(c.offset * 4 % 16, 0) << "fp32 chunk at element " << c.offset;
    const Owner first = OwnerOf(layout, c.offset),
                last = OwnerOf(layout, c.offset + c.elements - 1);
    ASSERT_EQ(first.tensor, last.tensor) << "chunk at " << c.offset << " spans tensors";
    ASSERT_EQ(first.layer, last.layer) << "chunk at " << c.offset << " spans layers";
    ASSERT_EQ(c.unit, UnitOf(layout.stage, first)) << ParamTensorName(first.tensor);
    ASSERT_EQ(c.decayed != 0, IsDecayed(first.tensor)) << ParamTensorName(first.tensor);
    next = c.offset + c.elements;
  }
  ASSERT_EQ(next, layout.total);
}

TEST(MultiTensorTableTest, CoversEveryTensorOfTheShippedModelsOnceInUnitOrder) {
  for (const GPT2Config& config : ShippedModels()) {
    CheckTable(MakeParamLayout(config, WholeModel(config)));
    for (int64_t pp : {2, 4}) {
      if (pp > config.n_layer) continue;
      absl::StatusOr<std::vector<StageSpec>> stages = SplitIntoStages(config, pp, {});
      ASSERT_TRUE(stages.ok()) << stages.status();
      for (const StageSpec& st : *stages) CheckTable(MakeParamLayout(config, st));
    }
  }
}

TEST(MultiTensorTableTest, Gpt2ChunksAndUnits) {
  const GPT2Config c = ShippedModels()[0];
  const MultiTensorTable t = MakeMultiTensorTable(MakeParamLayout(c, WholeModel(c)));
  EXPECT_EQ(t.units(), 14);  // embedding, 12 layers, final LayerNorm
  // wte 38.6M and wpe 0.79M elements: 590 + 12 chunks; a layer: 8 small tensors + 27 + 9 + 36
  // + 36 chunks of its matrices; the final LayerNorm 2.
  EXPECT_EQ(t.unit_begin[1], 590 + 12);
  EXPECT_EQ(t.unit_begin[2] - t.unit_begin[1], 8 + 27 + 9 + 36 + 36);
  EXPECT_EQ(t.unit_begin[14] - t.unit_begin[13], 2);
  EXPECT_EQ(t.counted_chunks(), static_cast<int32_t>(t.chunks.size()));
}

TEST(MultiTensorTableTest, HeadOnlyStageStepsButDoesNotCountTheTiedMatrix) {
  const GPT2Config c = ShippedModels()[0];
  const StageSpec head{6, 12, false, true};
  const ParamLayout layout = MakeParamLayout(c, head);
  const MultiTensorTable t = MakeMultiTensorTable(layout);
  EXPECT_EQ(t.units(), 7);
  int64_t uncounted = 0;
  for (size_t i = t.counted_chunks(); i < t.chunks.size(); ++i) uncounted += t.chunks[i].elements;
  EXPECT_EQ(uncounted, layout.slot(ParamTensor::kWte).elements);
}

TEST(MultiTensorTableTest, AdamWElementIsPyTorchsAdamW) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int step = 3;
  const AdamWScalars a{6e-4f,
                       0.9f,
                       0.95f,
                       1e-8f,
                       0.5f,
                       1.0f - std::pow(0.9f, float(step)),
                       1.0f - std::pow(0.95f, float(step))};
  for (int i = 0; i < 1000; ++i) {
    const float p0 = normal(rng), g = normal(rng), m0 = 0.1f * normal(rng);
    const float v0 = 0.01f * std::abs(normal(rng));
    const float wd = i % 2 ? 0.1f : 0.0f;
    float m = m0, v = v0;
    const float p = AdamWElement(p0, g, &m, &v, wd, a);
    const double gs = double(g) * a.grad_scale;
    const double m64 = 0.9 * m0 + 0.1 * gs, v64 = 0.95 * v0 + 0.05 * gs * gs;
    const double mhat = m64 / (1 - std::pow(0.9, step)), vhat = v64 / (1 - std::pow(0.95, step));
    const double p64 = p0 * (1 - double(a.lr) * wd) - a.lr * mhat / (std::sqrt(vhat) + 1e-8);
    ASSERT_NEAR(m, m64, 1e-6);
    ASSERT_NEAR(v, v64, 1e-6);
    ASSERT_NEAR(p, p64, 1e-6);
  }
}

// The memory plan holds the table and one fp64 partial per chunk for training, nothing for
// inference.
TEST(MultiTensorTableTest, MemoryPlanHoldsTheTableAndItsPartials) {
  for (const GPT2Config& c : ShippedModels()) {
    const MultiTensorTable t = MakeMultiTensorTable(MakeParamLayout(c, WholeModel(c)));
    const int64_t chunks = static_cast<int64_t>(t.chunks.size());
    MemoryPlan train, infer;
    const StageBufferIds ids = PlanStageMemory(c, WholeModel(c), 2, 64, 1, 2, &train);
    const StageBufferIds inf = PlanStageMemory(c, WholeModel(c), 2, 64, 1, 2, &infer, false);
    EXPECT_EQ(train.buffer(ids.multi_tensor_table).bytes, TableBytes(chunks, t.units()));
    EXPECT_EQ(UnitBeginOffsetBytes(chunks) % 16, 0);
    EXPECT_GE(UnitBeginOffsetBytes(chunks), chunks * static_cast<int64_t>(sizeof(TensorChunk)));
    EXPECT_EQ(train.buffer(ids.multi_tensor_partials).bytes, chunks * 8);
    EXPECT_EQ(infer.buffer(inf.multi_tensor_table).bytes, 0);
    EXPECT_EQ(infer.buffer(inf.multi_tensor_partials).bytes, 0);
    // The norm's units land after the loss sum's partials (kReduceBlocks) in reduce_partials.
    EXPECT_GE(train.buffer(ids.reduce_partials).bytes, (kReduceBlocks + t.units()) * 8);
  }
}

}  // namespace
}  // namespace freeride::cuda
