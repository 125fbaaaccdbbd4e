// ZeRO-1 (parallel.zero = 1) on 4 GPUs, one a rank (runtime.gpu = rank), the ranks as threads of
// this process over the in-process transport (host-staged sums in rank order, what the MPI
// transport gives at dp 2): at pp 2 × dp 2 the sharded run trains the unsharded run's bits —
// losses, gradient norms, every rank's parameters and each rank's moments at its share's
// places — under 1F1B and ZB-H1, in fp32 and bf16. On fewer GPUs it is skipped with the reason
// (the emulation build has one device: tests/emulation/zero_cuda_test.cc runs the same checks
// there with every rank on it).
#include <cuda_runtime_api.h>

#include <string>
#include <tuple>

#include "absl/strings/str_format.h"
#include "tests/gpu/emulated.h"
#include "tests/pipeline/train_parity.h"
#include "tests/pipeline/zero_run.h"

namespace freeride {
namespace {

constexpr int kSteps = 3;

TEST(ZeroGpuTest, ShardsOnFourGpusTrainTheUnshardedBits) {
  int visible = 0;
  ASSERT_EQ(cudaGetDeviceCount(&visible), cudaSuccess);
  if (visible < 4) {
    GTEST_SKIP() << absl::StrFormat("pp 2 × dp 2 needs 4 GPUs, one a rank; %d visible", visible);
  }
  testing::PrintShapes({"parity: 8 layers C 16 (2 heads) V 64, T 8, pp 2 × dp 2"});
  const std::string shard = testing::ParityShard();
  for (const auto& [kind, precision] : {std::tuple{"1f1b", "fp32"}, std::tuple{"zbh1", "bf16"},
                                        std::tuple{"1f1b", "bf16"}, std::tuple{"zbh1", "fp32"}}) {
    SCOPED_TRACE(absl::StrFormat("%s %s", kind, precision));
    Config config = testing::ParityConfig(shard, kind, 2, 2, 4, 4);
    config.runtime.device = "cuda";
    config.runtime.precision = precision;
    config.parallel.partition = "even";
    config.parallel.dp_bucket_mb = 1.0 / 256;  // buckets that cut tensors
    config.optim.grad_clip = 0.36;
    config.train.steps = kSteps;  // the last step finishes its all-gather
    const testing::ZeroRun whole = testing::Train(config, kSteps, /*gpu_per_rank=*/true);
    config.parallel.zero = 1;
    testing::ExpectSameBits(testing::Train(config, kSteps, /*gpu_per_rank=*/true), whole, 2);
  }
}

}  // namespace
}  // namespace freeride
