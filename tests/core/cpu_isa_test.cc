// The instruction-set check: which features each level needs, and that the build's own level
// runs on the CPU the suite runs on (else no kernel test could have run).
#include "core/cpu_isa.h"

#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace freeride {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// A CPU that has every feature but those in `absent`.
auto CpuWithout(std::set<std::string> absent) {
  return [absent](const char* f) { return absent.count(f) == 0; };
}

TEST(CpuIsaTest, EachLevelNamesWhatItLacks) {
  EXPECT_THAT(MissingIsaFeatures("x86-64-v3", CpuWithout({"avx2", "fma"})),
              ElementsAre("avx2", "fma"));
  // v3 includes v2.
  EXPECT_THAT(MissingIsaFeatures("x86-64-v3", CpuWithout({"sse4.2"})), ElementsAre("sse4.2"));
  // v2 asks nothing of AVX.
  EXPECT_THAT(MissingIsaFeatures("x86-64-v2", CpuWithout({"avx", "avx2", "popcnt"})),
              ElementsAre("popcnt"));
  EXPECT_THAT(MissingIsaFeatures("x86-64-v3", CpuWithout({})), IsEmpty());
}

TEST(CpuIsaTest, BaselineNativeAndDefaultAskNothing) {
  auto nothing = [](const char*) { return false; };
  EXPECT_THAT(MissingIsaFeatures("x86-64", nothing), IsEmpty());
  EXPECT_THAT(MissingIsaFeatures("native", nothing), IsEmpty());
  EXPECT_THAT(MissingIsaFeatures("default", nothing), IsEmpty());
}

TEST(CpuIsaTest, TheBuildsOwnLevelRunsHere) {
  EXPECT_TRUE(CheckCpuRunsBuildIsa().ok()) << CheckCpuRunsBuildIsa();
  EXPECT_THAT(BuildIsaSummary(), ::testing::StartsWith(BuildIsa()));
}

}  // namespace
}  // namespace freeride
