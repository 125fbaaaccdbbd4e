// The CUDA backend under the pipeline runtime: stages as threads on one GPU (the in-process
// transport; messages and cross-rank sums through host memory) reproduce the one-process
// CUDA run, and the one-process CUDA run follows the CPU backend.
#include "absl/strings/str_format.h"
#include "tests/pipeline/train_parity.h"

namespace freeride {
namespace {

using testing::ParityConfig;
using testing::ParityShard;
using testing::SingleProcessLosses;
using testing::ThreadedLosses;

Config OnCuda(Config config) {
  config.runtime.device = "cuda";
  return config;
}

void ExpectClose(const std::vector<double>& got, const std::vector<double>& want, double rel) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], rel * want[i]) << "step " << i;
}

TEST(CudaPipelineTest, OneProcessFollowsTheCpuBackend) {
  const std::string shard = ParityShard();
  const Config cpu = ParityConfig(shard, "1f1b", 1, 1, 4);
  ExpectClose(SingleProcessLosses(OnCuda(cpu)), SingleProcessLosses(cpu), 1e-4);
}

TEST(CudaPipelineTest, StagesAsThreadsMatchOneProcess) {
  const std::string shard = ParityShard();
  const std::vector<double> expected =
      SingleProcessLosses(OnCuda(ParityConfig(shard, "1f1b", 1, 1, 4)));
  for (const std::string schedule : {"gpipe", "1f1b", "zbh1"}) {
    SCOPED_TRACE(schedule);
    ExpectClose(ThreadedLosses(OnCuda(ParityConfig(shard, schedule, 2, 1, 4))), expected, 1e-6);
  }
  // Two replicas of batch 4 in 2 micro-batches = one process with batch 8 in 4.
  const std::vector<double> batch8 =
      SingleProcessLosses(OnCuda(ParityConfig(shard, "1f1b", 1, 1, 4, 8)));
  ExpectClose(ThreadedLosses(OnCuda(ParityConfig(shard, "1f1b", 2, 2, 2, 4))), batch8, 1e-6);
}

}  // namespace
}  // namespace freeride
