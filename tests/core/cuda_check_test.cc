// The CUDA-family check macros turn library codes into Status. None of this needs a GPU: the
// libraries' error-text functions work without a driver.
#include "core/cuda_check.h"

#include "gtest/gtest.h"

namespace freeride {
namespace {

absl::Status Cuda(cudaError_t code) {
  CUDA_CHECK(code);
  return absl::OkStatus();
}
absl::Status Cublas(cublasStatus_t code) {
  CUBLAS_CHECK(code);
  return absl::OkStatus();
}
#ifdef FREERIDE_WITH_CUDNN
absl::Status Cudnn(cudnnStatus_t code) {
  CUDNN_CHECK(code);
  return absl::OkStatus();
}
#endif
#ifdef FREERIDE_WITH_NCCL
absl::Status Nccl(ncclResult_t code) {
  NCCL_CHECK(code);
  return absl::OkStatus();
}
#endif

void ExpectMentions(const absl::Status& status, std::initializer_list<const char*> parts) {
  for (const char* part : parts) {
    EXPECT_NE(status.message().find(part), std::string::npos)
        << "'" << part << "' missing from: " << status.message();
  }
}

TEST(CudaCheckTest, SuccessPassesThrough) {
  EXPECT_TRUE(Cuda(cudaSuccess).ok());
  EXPECT_TRUE(Cublas(CUBLAS_STATUS_SUCCESS).ok());
#ifdef FREERIDE_WITH_CUDNN
  EXPECT_TRUE(Cudnn(CUDNN_STATUS_SUCCESS).ok());
#endif
#ifdef FREERIDE_WITH_NCCL
  EXPECT_TRUE(Nccl(ncclSuccess).ok());
#endif
}

TEST(CudaCheckTest, CudaErrorCarriesNameTextAndPlace) {
  absl::Status status = Cuda(cudaErrorMemoryAllocation);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  ExpectMentions(status, {"CUDA error 2", "cudaErrorMemoryAllocation", "out of memory",
                          "`code`", "cuda_check_test.cc:11"});
  EXPECT_EQ(Cuda(cudaErrorNoDevice).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Cuda(cudaErrorInvalidValue).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CudaCheckTest, CublasErrorCarriesStatusName) {
  absl::Status status = Cublas(CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  ExpectMentions(status, {"cuBLAS error", "CUBLAS_STATUS_NOT_SUPPORTED", "cuda_check_test.cc:15"});
}

#ifdef FREERIDE_WITH_CUDNN
TEST(CudaCheckTest, CudnnErrorCarriesStatusName) {
  absl::Status status = Cudnn(CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  ExpectMentions(status, {"cuDNN error", "CUDNN_STATUS_BAD_PARAM", "cuda_check_test.cc:20"});
}
#endif

#ifdef FREERIDE_WITH_NCCL
TEST(CudaCheckTest, NcclErrorCarriesText) {
  absl::Status status = Nccl(ncclInvalidArgument);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  ExpectMentions(status, {"NCCL error 4", "invalid argument", "cuda_check_test.cc:26"});
}
#endif

TEST(CudaCheckTest, LibraryVersionsNeedNoDriver) {
  CudaLibraryVersions versions = GetCudaLibraryVersions();
  EXPECT_GE(versions.runtime, 12000);
#ifdef FREERIDE_WITH_CUDNN
  EXPECT_GE(versions.cudnn, 90000u);
#endif
#ifdef FREERIDE_WITH_NCCL
  EXPECT_GE(versions.nccl, 20000);
#endif
  EXPECT_EQ(FormatCudaVersion(13000), "13.0");
  EXPECT_EQ(FormatCudaVersion(12080), "12.8");
}

}  // namespace
}  // namespace freeride
