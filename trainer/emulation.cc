#include "trainer/emulation.h"

#include <algorithm>
#include <random>

#include "core/timer.h"
#include "models/gpt2.h"

namespace freeride {

absl::StatusOr<pipeline::CostModel> CalibrateStageCosts(const GPT2Config& config,
                                                        const std::vector<StageSpec>& stages,
                                                        int64_t micro_batch, int64_t seq_len,
                                                        double link_gbs, uint64_t seed) {
  pipeline::CostModel cost;
  const int64_t rows = micro_batch * seq_len, floats = rows * config.n_embd;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  for (const StageSpec& spec : stages) {
    GPT2Stage<float> stage(config, spec, micro_batch, seq_len, 1);
    stage.InitRandom(seed);
    for (int64_t i = 0; i < rows; ++i) {
      if (spec.has_embedding) stage.tokens(0)[i] = static_cast<int32_t>(rng() % config.vocab_size);
      if (spec.has_head) stage.targets(0)[i] = static_cast<int32_t>(rng() % config.vocab_size);
    }
    for (int64_t i = 0; i < floats; ++i) stage.input_activations(0)[i] = u(rng);
    double f = 1e30, b = 1e30, w = 1e30;
    for (int rep = 0; rep < 4; ++rep) {  // the first run warms up; the fastest of the rest
      Timer t;
      stage.Forward(0);
      const double tf = t.ElapsedSeconds();
      if (!spec.has_head) {
        for (int64_t i = 0; i < floats; ++i) stage.output_grad(0)[i] = u(rng) * 1e-3f;
      }
      Timer tb;
      stage.BackwardInput(0, 1.0f / static_cast<float>(rows));
      const double tbi = tb.ElapsedSeconds();
      Timer tw;
      stage.BackwardWeight(0);
      const double tww = tw.ElapsedSeconds();
      if (rep > 0) f = std::min(f, tf), b = std::min(b, tbi), w = std::min(w, tww);
    }
    cost.stages.push_back({f * 1e3, b * 1e3, w * 1e3});
  }
  cost.comm = static_cast<double>(floats) * sizeof(float) / (link_gbs * 1e9) * 1e3;
  return cost;
}

}  // namespace freeride
