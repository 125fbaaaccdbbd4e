// CUDA training over NCCL between GPUs, one GPU per rank, the ranks as threads of this process
// (runtime.gpu = rank, as each rank of mpirun takes its node-local rank's): the losses of a
// 2-stage pipeline on 2 GPUs and of pp 2 × dp 2 on 4 equal bit for bit those of the same CUDA
// chunks on the same GPUs over the in-process transport, which sums host memory in rank order
// as the MPI transport does. NCCL's algorithm is pinned (NCCL_ALGO=Ring, NCCL_PROTO=Simple);
// every sum that reaches a loss has two members, exact in any order. Over NCCL no sum goes to
// the bootstrap transport, and the messages are the chunks' device buffers. A layout needing
// more GPUs than are visible is skipped with the reason (in the emulation build, which has
// one device, both are: its NCCL is tested by nccl_pipeline_test). Across processes, against
// the MPI transport itself: tests/scripts/nccl_pipeline_gpu.sh (ctest nccl_pipeline_gpu).
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "pipeline/comm/nccl_transport.h"
#include "tests/gpu/emulated.h"
#include "tests/pipeline/train_parity.h"
#include "trainer/transport_choice.h"

namespace freeride {
namespace {

constexpr int kSteps = 3;

struct RankRun {
  std::vector<double> losses;
  int64_t bootstrap_sums = -1;
  std::string error;
};

// `config` on pp × dp rank threads, rank r on GPU r, over NCCL (bootstrapped on the in-process
// world) or the in-process transport itself.
std::vector<RankRun> Train(const Config& config, bool nccl) {
  const int world = static_cast<int>(config.parallel.pp * config.parallel.dp);
  auto in_process = pipeline::MakeInProcessWorld(world);
  std::vector<RankRun> runs(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      RankRun& run = runs[r];
      Config mine = config;
      mine.runtime.gpu = r;
      std::unique_ptr<pipeline::Transport> over;
      if (nccl) {
        absl::StatusOr<pipeline::NcclTransportOptions> options = NcclOptionsOf(mine);
        if (!options.ok()) {
          run.error = std::string(options.status().message());
          return;
        }
        options->device = r;
        auto made = pipeline::MakeNcclTransport(*in_process[r], *options);
        if (!made.ok()) {
          run.error = std::string(made.status().message());
          return;
        }
        over = *std::move(made);
      }
      pipeline::Transport* transport = nccl ? over.get() : in_process[r].get();
      auto trainer = Trainer::Create(mine, transport);
      if (!trainer.ok()) {
        run.error = std::string(trainer.status().message());
        return;
      }
      for (int i = 0; i < kSteps && run.error.empty(); ++i) {
        auto step = (*trainer)->Step();
        if (step.ok()) {
          run.losses.push_back(step->loss);
        } else {
          run.error = std::string(step.status().message());
        }
      }
      run.bootstrap_sums = pipeline::NcclTransportBootstrapSums(*transport);
      trainer->reset();  // its teardown (AbortInFlight) before the transport goes
    });
  }
  for (std::thread& t : threads) t.join();
  return runs;
}

void ExpectNcclEqualsHostMemory(int pp, int dp, const std::string& shape) {
  int visible = 0;
  ASSERT_EQ(cudaGetDeviceCount(&visible), cudaSuccess);
  if (visible < pp * dp) {
    GTEST_SKIP() << absl::StrFormat("pp %d × dp %d needs %d GPUs, one a rank; %d visible", pp, dp,
                                    pp * dp, visible);
  }
  testing::PrintShapes({shape});
  setenv("NCCL_ALGO", "Ring", 1);
  setenv("NCCL_PROTO", "Simple", 1);
  Config config = testing::ParityConfig(testing::ParityShard(), "1f1b", pp, dp, 2 * pp);
  config.runtime.device = "cuda";
  config.parallel.partition = "even";  // the same split in both runs
  config.runtime.comm_timeout_s = 120;
  if (dp > 1) config.parallel.dp_bucket_mb = 1.0 / 256;  // buckets started inside the last W
  const std::vector<RankRun> host = Train(config, /*nccl=*/false);
  const std::vector<RankRun> nccl = Train(config, /*nccl=*/true);
  for (int r = 0; r < pp * dp; ++r) {
    SCOPED_TRACE(absl::StrFormat("rank %d", r));
    EXPECT_EQ(host[r].error, "");
    EXPECT_EQ(nccl[r].error, "");
    ASSERT_EQ(nccl[r].losses.size(), static_cast<size_t>(kSteps));
    EXPECT_EQ(nccl[r].losses, host[r].losses);
    EXPECT_EQ(nccl[r].losses, nccl[0].losses);
    EXPECT_EQ(nccl[r].bootstrap_sums, 0) << "sums handed to the bootstrap transport";
  }
}

TEST(NcclPipelineGpuTest, TwoStagesOnTwoGpus) {
  ExpectNcclEqualsHostMemory(2, 1, "parity: 8 layers C 16 (2 heads) V 64, T 8, 1F1B, 2 stages");
}

TEST(NcclPipelineGpuTest, TwoStagesTwoReplicasOnFourGpus) {
  ExpectNcclEqualsHostMemory(2, 2, "parity: 8 layers C 16 (2 heads) V 64, T 8, 1F1B, pp 2 × dp 2");
}

}  // namespace
}  // namespace freeride
