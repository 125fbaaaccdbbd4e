#include "core/status.h"

#include "gtest/gtest.h"

namespace freeride {
namespace {

absl::Status FailsWith(absl::StatusCode code) { return absl::Status(code, "inner failure"); }

absl::Status PropagatesFirstError(int* reached) {
  FR_RETURN_IF_ERROR(absl::OkStatus());
  ++*reached;
  FR_RETURN_IF_ERROR(FailsWith(absl::StatusCode::kNotFound));
  ++*reached;
  return absl::OkStatus();
}

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  FR_ASSIGN_OR_RETURN(int half, Half(x));
  FR_ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

TEST(StatusTest, ReturnIfErrorStopsAtTheFirstFailure) {
  int reached = 0;
  absl::Status status = PropagatesFirstError(&reached);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(reached, 1);
}

TEST(StatusTest, AssignOrReturnUnwrapsOrPropagates) {
  EXPECT_EQ(*Quarter(12), 3);
  absl::StatusOr<int> odd = Quarter(6);  // 6 -> 3 -> odd
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StatusTest, LibraryErrorNamesLibraryCodeTextExpressionAndPlace) {
  absl::Status status = LibraryError(absl::StatusCode::kInternal, "FooLib", 7, "FOO_BAD: bad",
                                     "foo(x)", "core/foo.cc", 42);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(status.message(), "FooLib error 7 (FOO_BAD: bad) in `foo(x)` at core/foo.cc:42");
}

TEST(StatusTest, AnnotateKeepsCodeAndAddsContext) {
  absl::Status status = Annotate(absl::NotFoundError("no file"), "loading the config");
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(status.message(), "no file\n  while loading the config");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "anything").ok());
}

}  // namespace
}  // namespace freeride
