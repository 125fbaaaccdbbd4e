// One optimizer step of a whole model on any StageModel (the CPU or the CUDA backend), with a
// batch drawn from `seed`: what the model suites compare between the backends.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "models/stage_model.h"

namespace freeride::testing {

// TrainStep's AdamW learning rate (its other settings are AdamWStep's defaults, weight decay 0.1).
inline constexpr double kTrainStepLr = 1e-3;

struct StepResult {
  double loss = 0;
  std::vector<double> units;
  std::vector<float> grads, params;
  std::vector<float> params_before;  // as the step found them
};

inline StepResult TrainStep(StageModel& model, int64_t step, uint32_t seed) {
  const int64_t BT = model.micro_batch() * model.seq_len();
  std::mt19937 rng(seed);
  std::vector<int32_t> tokens(BT), targets(BT);
  for (auto* v : {&tokens, &targets}) {
    for (int32_t& t : *v) t = static_cast<int32_t>(rng() % model.config().vocab_size);
  }
  StepResult r;
  EXPECT_TRUE(model.ZeroGrads().ok());
  EXPECT_TRUE(model.SetTokens(0, tokens.data()).ok());
  EXPECT_TRUE(model.SetTargets(0, targets.data()).ok());
  absl::StatusOr<double> loss = model.Forward(0);
  EXPECT_TRUE(loss.ok()) << loss.status();
  r.loss = loss.ok() ? *loss : 0;
  EXPECT_TRUE(model.BackwardInput(0, 1.0f / BT).ok());
  EXPECT_TRUE(model.BackwardWeight(0).ok());
  EXPECT_TRUE(model.FoldHeadWteGrad().ok());
  absl::StatusOr<std::vector<double>> units = model.GradSquaresByUnit();
  EXPECT_TRUE(units.ok());
  if (units.ok()) r.units = *units;
  absl::StatusOr<float*> grads = model.HostGrads(0, model.num_params());
  EXPECT_TRUE(grads.ok());
  if (grads.ok()) r.grads.assign(*grads, *grads + model.num_params());
  r.params_before.resize(model.num_params());
  EXPECT_TRUE(model.GetParams(r.params_before.data()).ok());
  AdamWStep adam;
  adam.lr = kTrainStepLr;
  adam.weight_decay = 0.1;
  adam.step = step;
  EXPECT_TRUE(model.ApplyAdamW(adam).ok());
  r.params.resize(model.num_params());
  EXPECT_TRUE(model.GetParams(r.params.data()).ok());
  return r;
}

}  // namespace freeride::testing
