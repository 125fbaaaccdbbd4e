// GPU training throughput of GPT-2 (124M by default) through the real training step
// (Trainer::Step on runtime.device = "cuda": forward, split backward, grad norm, AdamW), on
// random tokens: tokens/s, MFU against the device's dense peak, device memory planned and in
// use, and each step's ledger (launches, host syncs, allocations: CudaLedger). Only the warm-up
// step is traced, so the timed steps queue their compute as untraced runs do.
// bench/gpu/bench.sh runs it beside bench/pytorch_gpt2.py (the nanoGPT recipe) on the same GPU
// in one run.
// The fast kernels against the reference: runtime.kernels and runtime.attention as the last
// two arguments ("reference reference" is the one-operation path the GPU tests hold them to).
// Usage: gpu_train_bench [steps=20] [batch=8] [seq=1024] [precision=bf16] [layers=12]
//                        [width=768] [heads=12] [kernels=auto] [attention=auto]
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_format.h"
#include "bench/bench_trainer.h"
#include "models/cuda/cuda_stage_model.h"
#include "models/gpt2_config.h"

using namespace freeride;

namespace {

// Dense bf16 tensor-core peak (FLOP/s) of the GPUs the project targets; 0 when unknown.
double PeakBf16Flops(const std::string& name) {
  if (name.find("H200") != std::string::npos) return 989.4e12;
  if (name.find("H100") != std::string::npos) {
    return name.find("PCIe") != std::string::npos ? 756.0e12 : 989.4e12;
  }
  if (name.find("A100") != std::string::npos) return 312.0e12;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  auto arg = [&](int i, int64_t fallback) { return argc > i ? std::atoll(argv[i]) : fallback; };
  const int64_t steps = arg(1, 20), B = arg(2, 8), T = arg(3, 1024);
  const std::string precision = argc > 4 ? argv[4] : "bf16";
  const int64_t L = arg(5, 12), C = arg(6, 768), NH = arg(7, 12);
  const std::string kernels = argc > 8 ? argv[8] : "auto";
  const std::string attention = argc > 9 ? argv[9] : "auto";
  const int64_t warmup = 3;
  auto trainer = MakeBenchTrainer("freeride_gpu_train_bench", {L, C, NH, B, T, steps + warmup + 1},
                                  absl::StrFormat(R"([optim]
grad_clip = 1.0
weight_decay = 0.1
[trace]
steps = [1, 1]
[runtime]
device = "cuda"
precision = "%s"
kernels = "%s"
attention = "%s"
)", precision, kernels, attention));
  if (!trainer.ok()) {
    std::fprintf(stderr, "%s\n", std::string(trainer.status().message()).c_str());
    return 1;
  }
  auto* model = dynamic_cast<CudaStageModel*>(&(*trainer)->model());
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, model->device());
  const GPT2Config& m = model->config();
  const double flops_per_token = TrainingFlopsPerToken(m, T);
  std::printf("device: %s; model: L=%ld C=%ld NH=%ld params=%ld; B=%ld T=%ld %s; %.3f GFLOP/token\n",
              prop.name, (long)L, (long)C, (long)NH, (long)model->num_params(), (long)B, (long)T,
              precision.c_str(), flops_per_token / 1e9);
  std::printf("kernels: %s, attention: %s (%s)\n", kernels.c_str(), attention.c_str(),
              model->Describe().c_str());
  std::printf("planned device memory: %s\n", model->memory_plan().Report().c_str());
  for (int64_t i = 0; i < warmup; ++i) {
    absl::StatusOr<StepStats> s = (*trainer)->Step();
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.status().message()).c_str());
      return 1;
    }
  }
  double total = 0;
  CudaLedger before = model->ledger();
  for (int64_t i = 0; i < steps; ++i) {
    absl::StatusOr<StepStats> s = (*trainer)->Step();
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.status().message()).c_str());
      return 1;
    }
    total += s->step_s;
    const CudaLedger after = model->ledger();
    std::printf(
        "step %ld: loss %.4f  %.1f ms  %.0f tok/s  launches %ld  syncs %ld  allocations %ld\n",
        (long)s->step, s->loss, s->step_s * 1e3, s->tokens_per_s,
        (long)(after.launches - before.launches), (long)(after.syncs - before.syncs),
        (long)(after.allocations - before.allocations));
    before = after;
  }
  size_t free_bytes = 0, total_bytes = 0;
  cudaMemGetInfo(&free_bytes, &total_bytes);
  const double tok_s = static_cast<double>(steps * B * T) / total;
  const double peak = precision == "bf16" ? PeakBf16Flops(prop.name) : 0;
  std::printf("mean: %.1f ms/step  %.0f tokens/s  %.1f TFLOP/s  MFU %s  device memory in use "
              "%.2f GiB of %.2f GiB\n",
              total / steps * 1e3, tok_s, tok_s * flops_per_token / 1e12,
              peak > 0 ? absl::StrFormat("%.1f%%", 100 * tok_s * flops_per_token / peak).c_str()
                       : "n/a",
              (total_bytes - free_bytes) / double(1ll << 30), total_bytes / double(1ll << 30));
  std::filesystem::remove_all(std::filesystem::temp_directory_path() / "freeride_gpu_train_bench");
  return 0;
}
