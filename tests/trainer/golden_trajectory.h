// The PyTorch golden run (tests/data/gpt2_golden, made by tests/golden/make_gpt2_golden.py: an
// independent PyTorch GPT-2 with torch.optim.AdamW and clip_grad_norm_) as a test any backend
// is held to: the config that reproduces it, and the check of a trainer's 10 steps against it.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "trainer/trainer.h"

namespace freeride::testing {

inline Config GoldenConfig(const std::string& run_dir, const std::string& device) {
  auto config = ParseConfig(R"(
[run]
dir = ")" + run_dir + R"("
[model]
init_from = "tests/data/gpt2_golden/model.bin"
[data]
train = "tests/data/gpt2_golden/tokens.bin"
[train]
batch_size = 4
seq_len = 8
microbatches = 2
steps = 10
[optim]
lr = 3e-3
warmup_steps = 2
min_lr_ratio = 0.1
beta1 = 0.9
beta2 = 0.95
eps = 1e-8
weight_decay = 0.1
grad_clip = 1.0
[runtime]
device = ")" + device + R"("
)", "golden.toml");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : Config{};
}

// Steps `trainer` through the golden run: loss and gradient norm within 1e-4 relative, the
// learning rate within 1e-9.
inline void ExpectGoldenTrajectory(Trainer& trainer) {
  std::ifstream golden("tests/data/gpt2_golden/golden.txt");
  std::string line;
  int steps = 0;
  while (std::getline(golden, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    int64_t step;
    double loss, lr, norm;
    fields >> step >> loss >> lr >> norm;
    absl::StatusOr<StepStats> s = trainer.Step();
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->step, step);
    EXPECT_NEAR(s->loss, loss, 1e-4 * loss) << "step " << step;
    EXPECT_NEAR(s->lr, lr, 1e-9) << "step " << step;
    EXPECT_NEAR(s->grad_norm, norm, 1e-4 * norm) << "step " << step;
    ++steps;
  }
  EXPECT_EQ(steps, 10);
}

}  // namespace freeride::testing
