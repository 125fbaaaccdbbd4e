// The Llama family's key/value-cache decoder against the CPU LlamaStage it must agree with: each
// position's logits equal a full forward over the same prefix (closely in float, to rounding in
// double), greedy generation equals the argmax of recomputing every prefix from scratch, the
// cache is n_kv_head heads wide, and a cache past the context or a step past the cache is refused.
#include <algorithm>
#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "models/gpt2.h"
#include "models/kv_decoder.h"
#include "models/llama.h"
#include "models/sampling.h"
#include "tests/models/llama_fixture.h"

namespace freeride {
namespace {

// 4 query heads sharing 2 key/value heads of size 4, SwiGLU width 24, a context of 8.
GPT2Config TinyDecoderLlama(bool tied, int64_t n_kv_head = 2) {
  return *MakeLlamaConfig(/*n_layer=*/2, /*n_head=*/4, n_kv_head, /*n_embd=*/16,
                          /*max_seq_len=*/8, /*vocab_size=*/37, /*ffn_hidden=*/24,
                          /*rope_theta=*/100.0, /*norm_eps=*/1e-5, tied);
}

using testing::FullForwardLastLogits;
using testing::LivelyLlamaParams;

template <typename T>
void ExpectEveryPositionMatches(bool tied, double tolerance) {
  const GPT2Config cfg = TinyDecoderLlama(tied);
  const std::vector<T> params = LivelyLlamaParams<T>(cfg, 21);
  std::mt19937 rng(22);
  std::vector<std::vector<int32_t>> seqs(2, std::vector<int32_t>(cfg.max_seq_len));
  for (auto& s : seqs) {
    for (int32_t& id : s) id = static_cast<int32_t>(rng() % cfg.vocab_size);
  }
  auto decoder = MakeKvDecoder<T>(cfg, params.data(), /*batch=*/2, cfg.max_seq_len);
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  const int64_t Vp = cfg.padded_vocab_size;
  double worst = 0, scale = 0;
  for (int64_t t = 0; t < cfg.max_seq_len; ++t) {
    const int32_t step[2] = {seqs[0][t], seqs[1][t]};
    absl::StatusOr<const T*> logits = (*decoder)->Step(step);
    ASSERT_TRUE(logits.ok()) << logits.status();
    std::vector<std::vector<int32_t>> prefixes;
    for (const auto& s : seqs) prefixes.emplace_back(s.begin(), s.begin() + t + 1);
    const std::vector<T> expected = FullForwardLastLogits(cfg, params, prefixes);
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t v = 0; v < cfg.vocab_size; ++v) {
        const double want = expected[b * Vp + v], got = (*logits)[b * Vp + v];
        scale = std::max(scale, std::fabs(want));
        worst = std::max(worst, std::fabs(got - want) / (1 + std::fabs(want)));
        ASSERT_NEAR(got, want, tolerance * (1 + std::fabs(want)))
            << "row " << b << " position " << t << " token " << v;
      }
    }
  }
  EXPECT_GT(scale, 1.0) << "logits this small would hide a wrong position";
  EXPECT_EQ((*decoder)->position(), cfg.max_seq_len);
}

TEST(LlamaDecoderTest, EveryPositionEqualsTheFullForwardInFloat) {
  ExpectEveryPositionMatches<float>(/*tied=*/true, 1e-4);
  ExpectEveryPositionMatches<float>(/*tied=*/false, 1e-4);
}

TEST(LlamaDecoderTest, EveryPositionEqualsTheFullForwardInDouble) {
  ExpectEveryPositionMatches<double>(/*tied=*/true, 1e-12);
  ExpectEveryPositionMatches<double>(/*tied=*/false, 1e-12);
}

// Multi-query attention (one key/value head for every query head) and full multi-head (as many
// key/value heads as query heads): the grouping at both ends.
TEST(LlamaDecoderTest, GroupingsAtBothEndsEqualTheFullForward) {
  for (int64_t kv : {1, 4}) {
    const GPT2Config cfg = TinyDecoderLlama(true, kv);
    const std::vector<double> params = LivelyLlamaParams<double>(cfg, 3);
    auto decoder = MakeKvDecoder<double>(cfg, params.data(), 1, 5);
    ASSERT_TRUE(decoder.ok()) << decoder.status();
    std::vector<int32_t> seq = {4, 30, 4, 17, 9};
    for (size_t t = 0; t < seq.size(); ++t) {
      const double* logits = *(*decoder)->Step(&seq[t]);
      const std::vector<double> expected =
          FullForwardLastLogits(cfg, params, {{seq.begin(), seq.begin() + t + 1}});
      for (int64_t v = 0; v < cfg.vocab_size; ++v) {
        ASSERT_NEAR(logits[v], expected[v], 1e-12 * (1 + std::fabs(expected[v])))
            << "n_kv_head " << kv << " position " << t;
      }
    }
  }
}

TEST(LlamaDecoderTest, GreedyGenerationEqualsTheArgmaxOfRecomputingFromScratch) {
  const GPT2Config cfg = TinyDecoderLlama(false);
  const std::vector<float> params = LivelyLlamaParams<float>(cfg, 5);
  const std::vector<int32_t> prompt = {3, 11};
  auto decoder = MakeKvDecoder<float>(cfg, params.data(), 1, cfg.max_seq_len);
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  TokenSampler greedy(0.0, 0, 1);
  std::vector<int32_t> cached = prompt, recomputed = prompt;
  const float* logits = nullptr;
  for (int32_t id : prompt) logits = *(*decoder)->Step(&id);
  while (static_cast<int64_t>(cached.size()) < cfg.max_seq_len) {
    const int32_t next = greedy.Next(logits, cfg.vocab_size);
    cached.push_back(next);
    if (static_cast<int64_t>(cached.size()) < cfg.max_seq_len) logits = *(*decoder)->Step(&next);
  }
  const std::vector<int32_t> more = testing::GreedyFromScratch(
      cfg, params, prompt, cfg.max_seq_len - static_cast<int64_t>(prompt.size()));
  recomputed.insert(recomputed.end(), more.begin(), more.end());
  EXPECT_EQ(cached, recomputed);
  // Not one token throughout: the generation says something about the positions.
  EXPECT_GT(
      std::count_if(cached.begin() + 1, cached.end(), [&](int32_t id) { return id != cached[0]; }),
      0);
}

TEST(LlamaDecoderTest, TheCacheHoldsTheKeyValueHeadsOnly) {
  // Two key/value heads of 4 instead of four: the cache and the qkv row shrink by exactly that.
  const GPT2Config gqa = TinyDecoderLlama(true, 2), mha = TinyDecoderLlama(true, 4);
  const int64_t B = 3, len = 6, L = 2, hs = 4;
  EXPECT_EQ(KvDecoderWorkspaceFloats(mha, B, len) - KvDecoderWorkspaceFloats(gqa, B, len),
            2 * L * B * len * 2 * hs + B * 2 * 2 * hs);
}

TEST(LlamaDecoderTest, ACacheLongerThanTheContextOrAStepPastItIsRefused) {
  const GPT2Config cfg = TinyDecoderLlama(true);
  const std::vector<float> params = LivelyLlamaParams<float>(cfg, 1);
  auto too_long = MakeKvDecoder<float>(cfg, params.data(), 1, cfg.max_seq_len + 1);
  ASSERT_FALSE(too_long.ok());
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(too_long.status().message(),
            "a key/value cache of 9 positions is longer than the model's context "
            "(model.max_seq_len = 8)");
  EXPECT_FALSE(MakeKvDecoder<float>(cfg, params.data(), 0, 4).ok());

  auto decoder = MakeKvDecoder<float>(cfg, params.data(), 1, 2);
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  const int32_t id = 1;
  ASSERT_TRUE((*decoder)->Step(&id).ok());
  ASSERT_TRUE((*decoder)->Step(&id).ok());
  absl::StatusOr<const float*> past = (*decoder)->Step(&id);
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(past.status().message().find("holds 2 positions"), std::string::npos) << past.status();
  (*decoder)->Reset();
  EXPECT_TRUE((*decoder)->Step(&id).ok());

  // GPT-2 keeps the same door: a position table ends at max_seq_len.
  const GPT2Config gpt2 = *MakeGPT2Config(1, 2, 8, 4, 11);
  std::vector<float> gpt2_params(NumParameters(gpt2), 0.01f);
  EXPECT_FALSE(MakeKvDecoder<float>(gpt2, gpt2_params.data(), 1, 5).ok());
  EXPECT_TRUE(MakeKvDecoder<float>(gpt2, gpt2_params.data(), 1, 4).ok());
}

// GPT-2's decoder is templated with the shared cache too: in double it equals GPT2Stage<double>
// to rounding.
TEST(LlamaDecoderTest, Gpt2DecoderInDoubleEqualsItsFullForward) {
  const GPT2Config cfg = *MakeGPT2Config(2, 2, 16, 8, 50);
  GPT2Stage<double> full(cfg, WholeModel(cfg), 1, 6, 1);
  full.InitRandom(11);
  for (int64_t i = 0; i < full.num_params(); ++i) full.params()[i] *= 8.0;
  for (int i = 0; i < 6; ++i) full.tokens(0)[i] = (7 * i + 3) % 50, full.targets(0)[i] = 0;
  full.Forward(0);
  auto decoder = MakeKvDecoder<double>(cfg, full.params(), 1, 6);
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  for (int64_t t = 0; t < 6; ++t) {
    const double* logits = *(*decoder)->Step(full.tokens(0) + t);
    const double* expected = full.logits(0) + t * cfg.padded_vocab_size;
    for (int64_t v = 0; v < cfg.vocab_size; ++v) {
      ASSERT_NEAR(logits[v], expected[v], 1e-12 * (1 + std::fabs(expected[v]))) << t;
    }
  }
}

}  // namespace
}  // namespace freeride
