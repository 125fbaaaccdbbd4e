// CPU training throughput of GPT-2 124M through the real training step (Trainer::Step: forward,
// split backward, grad norm, AdamW), on random tokens. llm.c's CPU trainer (train_gpt2.c) is
// the named reference: about 4.8 s per step at B=4, T=64 on a 2-core AVX2 machine.
// Usage: train_bench [steps=6] [batch=4] [seq=64] [layers=12] [width=768] [heads=12]
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_format.h"
#include "bench/bench_trainer.h"
#include "core/blas_setup.h"
#include "core/float_env.h"
#include "models/gpt2_config.h"

using namespace freeride;

int main(int argc, char** argv) {
  FlushSubnormalsToZero();  // as freeride's main does
  UseBestBlasKernels(argv);
  auto arg = [&](int i, int64_t fallback) { return argc > i ? std::atoll(argv[i]) : fallback; };
  const int64_t steps = arg(1, 6), B = arg(2, 4), T = arg(3, 64);
  const int64_t L = arg(4, 12), C = arg(5, 768), NH = arg(6, 12);
  auto trainer = MakeBenchTrainer("freeride_train_bench", {L, C, NH, B, T, steps + 1}, "");
  if (!trainer.ok())
    return std::fprintf(stderr, "%s\n", std::string(trainer.status().message()).c_str()), 1;
  const GPT2Config& m = (*trainer)->model().config();
  const double flops_per_token = TrainingFlopsPerToken(m, T);
  std::printf(
      "model: L=%ld C=%ld NH=%ld params=%ld; B=%ld T=%ld; threads=%d; BLAS kernels %s; "
      "%.3f GFLOP/token\n",
      (long)L, (long)C, (long)NH, (long)(*trainer)->model().num_params(), (long)B, (long)T,
      omp_get_max_threads(), BlasCoreName(), flops_per_token / 1e9);
  (void)(*trainer)->Step();  // warm-up: first touch of memory, thread pools
  double total = 0;
  for (int64_t i = 0; i < steps; ++i) {
    const StepStats s = *(*trainer)->Step();
    total += s.step_s;
    std::printf("step %ld: loss %.4f  %.3f s  %.1f tok/s\n", (long)s.step, s.loss, s.step_s,
                s.tokens_per_s);
  }
  const double tok_s = static_cast<double>(steps * B * T) / total;
  std::printf(
      "mean: %.3f s/step  %.1f tokens/s  %.1f GFLOP/s  (llm.c CPU reference 4.8 s/step, "
      "53 tokens/s: %.1fx)\n",
      total / steps, tok_s, tok_s * flops_per_token / 1e9, tok_s / 53.0);
  std::filesystem::remove_all(std::filesystem::temp_directory_path() / "freeride_train_bench");
  return 0;
}
