// The fused classifier's arithmetic (models/cuda/classifier_math.h), run on the CPU exactly as
// the kernel composes it: each of the block's threads' online softmax over its 128-bit
// vectors of a row, merged by the warps' shuffle trees and then across warps, against float64
// log-softmax over real rows (GPT-2's 50257 columns padded to 50304, bf16-rounded logits).
#include "models/cuda/classifier_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace freeride::cuda::classifier {
namespace {

constexpr int kV = 50257, kVp = 50304;

// bf16 round to nearest even, as __float2bfloat16_rn.
float RoundBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  bits &= 0xffff0000u;
  float y;
  std::memcpy(&y, &bits, 4);
  return y;
}

// One row of logits: normal(0, sigma) over the real columns, with one spike; the padded
// columns hold a large value that would dominate the softmax were they counted.
std::vector<float> Row(uint32_t seed, float sigma, float spike, bool bf16) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> x(kVp, 30.0f);
  for (int v = 0; v < kV; ++v) x[v] = normal(rng);
  x[seed % kV] = spike;
  if (bf16) {
    for (float& e : x) e = RoundBf16(e);
  }
  return x;
}

// The row's state as the kernel computes it: ThreadShare per thread, the xor shuffle tree of
// each warp, the warps' lane-0 states through the same tree in warp 0. Also checks that every
// lane of every tree ends with the same bits (what lets the kernel read any lane).
template <int W>
OnlineSoftmax KernelState(const std::vector<float>& x) {
  auto load = [&](int vec, float* out) {
    for (int k = 0; k < W; ++k) out[k] = x[vec * W + k];
  };
  auto tree = [](std::vector<OnlineSoftmax> lanes) {
    for (int o = 16; o > 0; o >>= 1) {
      std::vector<OnlineSoftmax> next(32);
      for (int i = 0; i < 32; ++i) next[i] = Merge(lanes[i], lanes[i ^ o]);
      lanes = next;
    }
    for (int i = 1; i < 32; ++i) {
      EXPECT_EQ(std::memcmp(&lanes[i], &lanes[0], sizeof(OnlineSoftmax)), 0) << "lane " << i;
    }
    return lanes[0];
  };
  std::vector<OnlineSoftmax> warps(32);
  for (int w = 0; w < kThreads / 32; ++w) {
    std::vector<OnlineSoftmax> lanes(32);
    for (int l = 0; l < 32; ++l) lanes[l] = ThreadShare<W>(load, w * 32 + l, kThreads, kV, kVp);
    warps[w] = tree(lanes);
  }
  return tree(warps);
}

struct Want {
  double lse;
  std::vector<double> p;
};
Want Float64(const std::vector<float>& x) {
  double mx = -INFINITY;
  for (int v = 0; v < kV; ++v) mx = std::max(mx, double(x[v]));
  double sum = 0;
  for (int v = 0; v < kV; ++v) sum += std::exp(double(x[v]) - mx);
  Want w{mx + std::log(sum), std::vector<double>(kV)};
  for (int v = 0; v < kV; ++v) w.p[v] = std::exp(double(x[v]) - w.lse);
  return w;
}

template <int W>
void CheckRow(const std::vector<float>& x, int target) {
  const OnlineSoftmax s = KernelState<W>(x);
  const Want want = Float64(x);
  const float lse = LogSumExp(s);
  ASSERT_NEAR(lse, want.lse, 2e-5 * std::abs(want.lse) + 1e-5);
  EXPECT_NEAR(Loss(lse, x[target]), want.lse - x[target], 1e-4);
  const float scale = 1.0f / 8192;  // 1 / (B·T) of a GPT-2 micro-batch
  for (int v = 0; v < kVp; ++v) {
    const float g = Gradient(x[v], lse, v == target, v >= kV, scale);
    if (v >= kV) {
      ASSERT_EQ(g, 0.0f) << "padded column " << v;
      continue;
    }
    const double g64 = scale * (want.p[v] - (v == target ? 1.0 : 0.0));
    // p − 1 at the target rounds to fp32: an absolute 1e-7 of p there.
    ASSERT_NEAR(g, g64, scale * (1e-4 * want.p[v] + (v == target ? 1e-7 : 1e-9))) << "column " << v;
  }
}

TEST(ClassifierMathTest, Bf16RowsMatchFloat64LogSoftmax) {
  // Narrow and wide logit spreads, a confident right prediction and a confident wrong one.
  CheckRow<8>(Row(1, 0.5f, 1.0f, true), 17);
  CheckRow<8>(Row(2, 3.0f, 8.0f, true), 2);
  CheckRow<8>(Row(3, 2.0f, 40.0f, true), 3);  // the target is the spike: loss ≈ 0
  CheckRow<8>(Row(4, 2.0f, 40.0f, true), kV - 1);
}

TEST(ClassifierMathTest, Fp32RowsMatchFloat64LogSoftmax) {
  CheckRow<4>(Row(5, 1.0f, 3.0f, false), 12345);
  CheckRow<4>(Row(6, 4.0f, -20.0f, false), 0);
}

TEST(ClassifierMathTest, EmptyStatesMergeToEmptyAndNeverNaN) {
  const OnlineSoftmax empty;
  const OnlineSoftmax e = Merge(empty, empty);
  EXPECT_EQ(e.max, -INFINITY);
  EXPECT_EQ(e.sum, 0.0f);
  const OnlineSoftmax one{2.0f, 1.5f};
  const OnlineSoftmax m = Merge(empty, one);
  EXPECT_EQ(m.max, 2.0f);
  EXPECT_EQ(m.sum, 1.5f);
  EXPECT_EQ(Merge(one, empty).sum, 1.5f);
}

TEST(ClassifierMathTest, ShapesOfEveryShippedModelAreSupported) {
  // Vocabularies are padded to multiples of 128 (GPT2Config): whole vectors in both precisions.
  for (int64_t vp : {50304, 4096, 128}) {
    EXPECT_TRUE(ShapeSupported(8 * 1024, vp, 2));
    EXPECT_TRUE(ShapeSupported(8 * 1024, vp, 4));
  }
  EXPECT_FALSE(ShapeSupported(8, 50257, 2));  // a row would end mid-vector
  EXPECT_FALSE(ShapeSupported(8, 50258, 4));
  EXPECT_FALSE(ShapeSupported(int64_t{1} << 31, 50304, 2));  // rows are gridDim.x
  EXPECT_EQ(VectorWidth(2), 8);
  EXPECT_EQ(VectorWidth(4), 4);
}

}  // namespace
}  // namespace freeride::cuda::classifier
