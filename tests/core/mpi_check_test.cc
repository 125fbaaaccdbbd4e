#include "core/mpi_check.h"

#include "gtest/gtest.h"

namespace freeride {
namespace {

absl::Status Fails(int code) {
  MPI_CHECK(code);
  return absl::OkStatus();
}

TEST(MpiCheckTest, SuccessPassesThrough) { EXPECT_TRUE(Fails(MPI_SUCCESS).ok()); }

TEST(MpiCheckTest, ErrorCarriesMpiTextExpressionAndLine) {
  absl::Status status = Fails(MPI_ERR_RANK);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  const std::string message(status.message());
  EXPECT_NE(message.find("MPI error"), std::string::npos) << message;
  EXPECT_NE(message.find("invalid rank"), std::string::npos) << message;  // MPI's own words
  EXPECT_NE(message.find("`code`"), std::string::npos) << message;
  EXPECT_NE(message.find("mpi_check_test.cc:9"), std::string::npos) << message;
}

TEST(MpiCheckTest, OutOfMemoryIsResourceExhausted) {
  EXPECT_EQ(Fails(MPI_ERR_NO_MEM).code(), absl::StatusCode::kResourceExhausted);
}

TEST(MpiCheckTest, LibraryVersionIsReadableBeforeInit) {
  EXPECT_NE(MpiLibraryVersion().find("MPI"), std::string::npos) << MpiLibraryVersion();
}

}  // namespace
}  // namespace freeride
