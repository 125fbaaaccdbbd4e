// What the GPT-2 and Llama stage suites check alike, for either stage class (GPT2Stage,
// LlamaStage): a micro-batch of seeded tokens, and split backward (BackwardInput, then
// BackwardWeight deferred as zero-bubble schedules do) equal to combined backward bit for bit.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>

#include "gtest/gtest.h"
#include "models/gpt2_config.h"

namespace freeride::testing {

// Tokens and targets of `slot` drawn from `seed`, each where the stage has the embedding or head.
template <typename Stage>
void FillBatch(Stage& m, int slot, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const int64_t n = m.micro_batch() * m.seq_len();
  for (int64_t i = 0; i < n; ++i) {
    if (m.stage().has_embedding) m.tokens(slot)[i] = rng() % m.config().vocab_size;
    if (m.stage().has_head) m.targets(slot)[i] = rng() % m.config().vocab_size;
  }
}

// Two micro-batches of 2 × 5 through the whole model `cfg`: F0 B0 W0 F1 B1 W1 against
// F0 F1 B0 B1 W0 W1 (weights deferred); the gradients must be equal bit for bit.
template <typename Stage>
void ExpectSplitBackwardEqualsInterleaved(const GPT2Config& cfg) {
  Stage a(cfg, WholeModel(cfg), 2, 5, 2), b(cfg, WholeModel(cfg), 2, 5, 2);
  a.InitRandom(7);
  b.InitRandom(7);
  for (Stage* m : {&a, &b}) {
    FillBatch(*m, 0, 1);
    FillBatch(*m, 1, 2);
    m->ZeroGrads();
  }
  for (int s = 0; s < 2; ++s) {
    a.Forward(s);
    a.BackwardInput(s, 0.05f);
    a.BackwardWeight(s);
  }
  b.Forward(0);
  b.Forward(1);
  b.BackwardInput(0, 0.05f);
  b.BackwardInput(1, 0.05f);
  b.BackwardWeight(0);
  b.BackwardWeight(1);
  a.FoldHeadWteGrad();
  b.FoldHeadWteGrad();
  EXPECT_EQ(0, std::memcmp(a.grads(), b.grads(), a.num_params() * sizeof(*a.grads())));
}

}  // namespace freeride::testing
