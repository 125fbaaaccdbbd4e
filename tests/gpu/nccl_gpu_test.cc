// NCCL on one GPU: a single-rank communicator sending to itself and summing, on device
// buffers, bootstrapped over the one-rank transport.
#include <cuda_runtime.h>  // the typed cudaMalloc

#include <vector>

#include "gtest/gtest.h"
#include "pipeline/comm/nccl_comm.h"

namespace freeride::pipeline {
namespace {

TEST(NcclCommTest, SingleRankSendsToItselfAndSums) {
  std::unique_ptr<Transport> self = MakeSelfTransport();
  auto comm = NcclComm::Create(*self, 0, 30.0);
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->size(), 1);
  const int64_t n = 1 << 20;
  std::vector<float> host(n);
  for (int64_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 977) * 0.5f;
  float *send, *recv;
  ASSERT_EQ(cudaMalloc(&send, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&recv, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(send, host.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(recv, 0, n * 4), cudaSuccess);
  ASSERT_TRUE((*comm)->Exchange(send, n * 4, 0, recv, n * 4, 0, nullptr).ok());
  ASSERT_TRUE((*comm)->AllReduceSum(recv, n, nullptr).ok());  // one rank: the identity
  ASSERT_TRUE((*comm)->Wait(30.0).ok());
  std::vector<float> back(n);
  ASSERT_EQ(cudaMemcpy(back.data(), recv, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);
  cudaFree(send);
  cudaFree(recv);
}

}  // namespace
}  // namespace freeride::pipeline
