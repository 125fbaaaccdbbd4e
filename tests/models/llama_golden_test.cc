// The CPU Llama against PyTorch: tests/golden/make_llama_golden.py trains the same tiny config
// from the same initial weights for 10 AdamW steps; our fp32 losses and step 1's gradients
// match its fp32 ones to 1e-5.
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/cpu_stage_model.h"
#include "nlohmann/json.hpp"

namespace freeride {
namespace {

constexpr char kLlamaGolden[] = "tests/data/llama_golden";

std::vector<float> ReadFloats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

TEST(LlamaGoldenTest, LossesOverTenAdamWStepsAndGradientsMatchPyTorch) {
  std::ifstream in(std::string(kLlamaGolden) + "/golden.json");
  ASSERT_TRUE(in) << kLlamaGolden << "/golden.json";
  const nlohmann::json g = nlohmann::json::parse(in);
  const nlohmann::json& m = g["model"];
  absl::StatusOr<GPT2Config> cfg = MakeLlamaConfig(
      m["n_layer"], m["n_head"], m["n_kv_head"], m["n_embd"], m["max_seq_len"], m["vocab_size"],
      m["ffn_hidden"], m["rope_theta"], m["norm_eps"], m["tie_embeddings"]);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  const int64_t B = g["batch_size"], T = g["seq_len"];
  CpuLlamaStageModel model(*cfg, WholeModel(*cfg), B, T, 1);
  const std::vector<float> init = ReadFloats(std::string(kLlamaGolden) + "/init.bin");
  const std::vector<float> grads1 = ReadFloats(std::string(kLlamaGolden) + "/grads1.bin");
  ASSERT_EQ(static_cast<int64_t>(init.size()), model.num_params());
  ASSERT_EQ(grads1.size(), init.size());
  ASSERT_TRUE(model.SetParams(init.data()).ok());

  const std::vector<double> losses = g["losses"];
  const std::vector<std::vector<int32_t>> batches = g["tokens"];
  ASSERT_EQ(losses.size(), 10u);
  AdamWStep adam;
  adam.lr = g["optim"]["lr"];
  adam.beta1 = g["optim"]["beta1"];
  adam.beta2 = g["optim"]["beta2"];
  adam.eps = g["optim"]["eps"];
  adam.weight_decay = g["optim"]["weight_decay"];
  for (size_t step = 0; step < losses.size(); ++step) {
    std::vector<int32_t> tokens, targets;
    for (int64_t b = 0; b < B; ++b) {
      const int32_t* row = batches[step].data() + b * (T + 1);
      tokens.insert(tokens.end(), row, row + T);
      targets.insert(targets.end(), row + 1, row + T + 1);
    }
    ASSERT_TRUE(model.ZeroGrads().ok());
    ASSERT_TRUE(model.SetTokens(0, tokens.data()).ok());
    ASSERT_TRUE(model.SetTargets(0, targets.data()).ok());
    const double loss = *model.Forward(0);
    EXPECT_NEAR(loss, losses[step], 1e-5) << "step " << step + 1;
    ASSERT_TRUE(model.BackwardInput(0, 1.0f / static_cast<float>(B * T)).ok());
    ASSERT_TRUE(model.BackwardWeight(0).ok());
    ASSERT_TRUE(model.FoldHeadWteGrad().ok());
    if (step == 0) {
      const float* grads = *model.HostGrads(0, model.num_params());
      double worst = 0;
      int64_t worst_i = 0;
      for (int64_t i = 0; i < model.num_params(); ++i) {
        const double err = std::fabs(grads[i] - grads1[i]);
        if (err > worst) worst = err, worst_i = i;
      }
      EXPECT_LT(worst, 1e-5) << "gradient element " << worst_i << ": ours " << grads[worst_i]
                             << ", PyTorch's " << grads1[worst_i];
    }
    adam.step = static_cast<int64_t>(step) + 1;
    ASSERT_TRUE(model.ApplyAdamW(adam).ok());
  }
}

}  // namespace
}  // namespace freeride
