// A small Llama model for the tests of what reads one (the decoder, sample, eval, gpt_infer,
// serve), and the reference they are held to: the CPU LlamaStage's full forward, recomputed
// from scratch over each prefix.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/llama.h"
#include "models/llmc_checkpoint.h"
#include "models/sampling.h"

namespace freeride::testing {

// The whole model's parameters, livelier than the init (×8) so that attention is far from
// uniform and the rotations matter.
template <typename T>
std::vector<T> LivelyLlamaParams(const GPT2Config& cfg, uint64_t seed) {
  LlamaStage<T> m(cfg, WholeModel(cfg), 1, 1, 1);
  m.InitRandom(seed);
  std::vector<T> p(m.params(), m.params() + m.num_params());
  for (T& x : p) x *= 8;
  return p;
}

// The logits [rows, padded vocab] at the last position of a full forward over each prefix (all
// of one length).
template <typename T>
std::vector<T> FullForwardLastLogits(const GPT2Config& cfg, const std::vector<T>& params,
                                     const std::vector<std::vector<int32_t>>& prefixes) {
  const int64_t B = static_cast<int64_t>(prefixes.size());
  const int64_t n = static_cast<int64_t>(prefixes[0].size()), Vp = cfg.padded_vocab_size;
  LlamaStage<T> m(cfg, WholeModel(cfg), B, n, 1);
  std::copy(params.begin(), params.end(), m.params());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < n; ++t) {
      m.tokens(0)[b * n + t] = prefixes[b][t];
      m.targets(0)[b * n + t] = 0;
    }
  }
  m.Forward(0);
  std::vector<T> last;
  for (int64_t b = 0; b < B; ++b) {
    const T* row = m.logits(0) + (b * n + n - 1) * Vp;
    last.insert(last.end(), row, row + Vp);
  }
  return last;
}

// `count` tokens after `context`, each the most likely (TokenSampler at temperature 0) by a
// full forward over everything before it.
inline std::vector<int32_t> GreedyFromScratch(const GPT2Config& cfg,
                                              const std::vector<float>& params,
                                              std::vector<int32_t> context, int64_t count) {
  TokenSampler greedy(0.0, 0, 1);
  std::vector<int32_t> out;
  for (int64_t i = 0; i < count; ++i) {
    const std::vector<float> last = FullForwardLastLogits(cfg, params, {context});
    out.push_back(greedy.Next(last.data(), cfg.vocab_size));
    context.push_back(out.back());
  }
  return out;
}

// A Llama model file (llm.c's format with the family in its header) of LivelyLlamaParams.
inline std::vector<float> WriteLlamaModel(const std::string& path, const GPT2Config& cfg,
                                          uint64_t seed) {
  std::vector<float> params = LivelyLlamaParams<float>(cfg, seed);
  const absl::Status written = WriteLlmcModel(path, cfg, params.data());
  EXPECT_TRUE(written.ok()) << written;
  return params;
}

}  // namespace freeride::testing
