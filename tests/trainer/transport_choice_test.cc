// parallel.transport and runtime.gpu: which transport a training takes, why (the start log),
// and the errors where the one asked for cannot be had.
#include "trainer/transport_choice.h"

#include <cstdlib>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace freeride {
namespace {

using ::testing::HasSubstr;

Config With(const std::string& device, const std::string& transport) {
  Config config;
  config.runtime.device = device;
  config.parallel.transport = transport;
  return config;
}

// ZeRO-1 at dp 2: its reduce-scatter and all-gather run over NCCL as the sums do.
Config ZeroOne(Config config) {
  config.parallel.dp = 2;
  config.parallel.zero = 1;
  return config;
}

// Post-validated steps: their rollbacks post the receives of the messages sent ahead again,
// in each link's order (they hung over NCCL before: StageExecutor::DiscardAhead).
Config PostValidated(Config config) {
  config.optim.step_sync = "post_validate";
  return config;
}

TEST(TransportChoiceTest, AutoTakesNcclOnlyForCudaStagesOfSeveralRanksWithNccl) {
  auto nccl = ChooseTransport(With("cuda", "auto"), 4, true);
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  EXPECT_TRUE(nccl->nccl);
  // ZeRO-1 changes nothing: its reduces and broadcasts run on the device too, with
  // post-validated steps or without.
  for (const Config& config :
       {ZeroOne(With("cuda", "auto")), PostValidated(ZeroOne(With("cuda", "auto"))),
        PostValidated(With("cuda", "auto"))}) {
    auto zero = ChooseTransport(config, 4, true);
    ASSERT_TRUE(zero.ok()) << zero.status();
    EXPECT_TRUE(zero->nccl) << zero->why;
  }
  auto asked = ChooseTransport(PostValidated(ZeroOne(With("cuda", "nccl"))), 4, true);
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_TRUE(asked->nccl);
  EXPECT_THAT(DescribeTransport(*nccl, 3),
              HasSubstr("NCCL carries activations, gradients and every sum"));
  EXPECT_THAT(DescribeTransport(*nccl, 3), HasSubstr("cuda:3"));
  for (const auto& [config, world, built, why] :
       std::vector<std::tuple<Config, int, bool, std::string>>{
           {With("cpu", "auto"), 4, true, "the stages run on the cpu"},
           {With("cuda", "auto"), 1, true, "one rank"},
           {With("cuda", "auto"), 4, false, "no NCCL that joins processes"},
           {With("cuda", "mpi"), 4, true, "parallel.transport = \"mpi\""},
           {ZeroOne(With("cuda", "auto")), 4, false, "no NCCL that joins processes"}}) {
    auto mpi = ChooseTransport(config, world, built);
    ASSERT_TRUE(mpi.ok()) << mpi.status();
    EXPECT_FALSE(mpi->nccl) << why;
    EXPECT_THAT(DescribeTransport(*mpi, 0), HasSubstr("MPI carries"));
    EXPECT_THAT(DescribeTransport(*mpi, 0), HasSubstr(why));
  }
}

TEST(TransportChoiceTest, NcclWhereItCannotBeHadIsAnErrorNamingTheKey) {
  auto cpu = ChooseTransport(With("cpu", "nccl"), 2, true);
  EXPECT_EQ(cpu.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cpu.status().message(), HasSubstr("parallel.transport = \"nccl\""));
  auto unbuilt = ChooseTransport(With("cuda", "nccl"), 2, false);
  EXPECT_EQ(unbuilt.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(unbuilt.status().message(), HasSubstr("emulation build"));
  auto fine = ChooseTransport(With("cuda", "nccl"), 2, true);
  ASSERT_TRUE(fine.ok());
  EXPECT_TRUE(fine->nccl);
}

TEST(TransportChoiceTest, AnUnknownTransportIsRefusedWithItsValue) {
  auto bad =
      ParseConfig("[data]\ntrain = \"x.bin\"\n[parallel]\ntransport = \"gloo\"\n", "t.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("parallel.transport"));
  EXPECT_THAT(bad.status().message(), HasSubstr("gloo"));
}

TEST(TransportChoiceTest, GpuIsTheNodeLocalRankUnlessSet) {
  Config config;
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
  EXPECT_EQ(GpuOf(config), 3);
  config.runtime.gpu = 1;
  EXPECT_EQ(GpuOf(config), 1);
  unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
}

}  // namespace
}  // namespace freeride
