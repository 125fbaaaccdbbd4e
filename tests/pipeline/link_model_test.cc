// The transports' link models against their closed forms: NCCL's α–β over NVLink and
// InfiniBand, MPI's the same over InfiniBand plus two staged copies over PCIe, 2·(α_s +
// bytes/β_s), for a message and for the ring all-reduce; the refusals name the flag.
#include "pipeline/link_model.h"

#include "gmock/gmock.h"

namespace freeride::pipeline {
namespace {

using ::testing::HasSubstr;

TEST(LinkModelTest, NcclCarriesDeviceBuffersOverTheFabric) {
  absl::StatusOr<TransportLinks> ib = TransportLinksOf("nccl", "ib");
  ASSERT_TRUE(ib.ok()) << ib.status();
  // 1 MB: 9.6 µs + 10^6 B / 50 GB/s = 0.0096 + 0.02 ms.
  EXPECT_NEAR(PointToPointMs(ib->link, 1e6), 0.0096 + 0.02, 1e-12);
  // Ring over 8 ranks, 1 GB: 2·7 steps of 9.6 µs + 2·(7/8)·20 ms.
  EXPECT_NEAR(AllReduceMs(AllReduceAlgorithm::kRing, ib->network, 1e9, 8), 14 * 0.0096 + 35, 1e-9);
  absl::StatusOr<TransportLinks> nvlink = TransportLinksOf("nccl", "nvlink");
  ASSERT_TRUE(nvlink.ok()) << nvlink.status();
  // 1 GB over 8 ranks on NVLink: 2·7·3.4 µs + 2·(7/8)·10^9 / 450·10^9 s.
  EXPECT_NEAR(AllReduceMs(AllReduceAlgorithm::kRing, nvlink->network, 1e9, 8),
              14 * 0.0034 + 1.75 * 1e3 / 450, 1e-9);
  EXPECT_THAT(nvlink->description, HasSubstr("NCCL over NVLink 4 (450 GB/s, 3.4 µs a step)"));
}

TEST(LinkModelTest, MpiStagesThroughHostMemoryOverPcie) {
  absl::StatusOr<TransportLinks> mpi = TransportLinksOf("mpi", "ib");
  ASSERT_TRUE(mpi.ok()) << mpi.status();
  absl::StatusOr<TransportLinks> nccl = TransportLinksOf("nccl", "ib");
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  // Each of the two copies: 10 µs + bytes / 63 GB/s.
  const double copies_1mb = 2 * (0.010 + 1e6 * 1e3 / 63e9);
  EXPECT_NEAR(PointToPointMs(mpi->link, 1e6), PointToPointMs(nccl->link, 1e6) + copies_1mb, 1e-12);
  const double copies_1gb = 2 * (0.010 + 1e9 * 1e3 / 63e9);
  for (AllReduceAlgorithm algorithm : {AllReduceAlgorithm::kRing, AllReduceAlgorithm::kTree}) {
    EXPECT_NEAR(AllReduceMs(algorithm, mpi->network, 1e9, 8),
                AllReduceMs(algorithm, nccl->network, 1e9, 8) + copies_1gb, 1e-9);
  }
  EXPECT_EQ(AllReduceMs(AllReduceAlgorithm::kRing, mpi->network, 1e9, 1), 0);  // nothing to sum
  EXPECT_THAT(mpi->description, HasSubstr("staged through host memory over PCIe 5.0"));
}

TEST(LinkModelTest, RefusalsNameTheFlag) {
  absl::StatusOr<TransportLinks> bad = TransportLinksOf("gloo", "ib");
  EXPECT_THAT(bad.status().message(), HasSubstr("--transport: expected nccl or mpi, found 'gloo'"));
  bad = TransportLinksOf("nccl", "ethernet");
  EXPECT_THAT(bad.status().message(), HasSubstr("--fabric: expected nvlink or ib"));
  bad = TransportLinksOf("mpi", "nvlink");
  EXPECT_THAT(bad.status().message(), HasSubstr("--transport mpi --fabric nvlink"));
}

}  // namespace
}  // namespace freeride::pipeline
