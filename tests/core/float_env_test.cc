// Subnormal floats are flushed to zero by the thread that asks and by the threads it starts
// afterwards (as OpenMP's and OpenBLAS's pools are), and not before it asks. Each case runs in
// a thread of its own so the rest of the test binary keeps the default mode.
#include "core/float_env.h"

#include <thread>

#include "gtest/gtest.h"

namespace freeride {
namespace {

// A product whose exact value (1e-40) is subnormal in float, and a subnormal operand.
float SubnormalProduct() {
  volatile float a = 1e-30f, b = 1e-10f;
  return a * b;
}
float SubnormalOperandTimesOne() {
  volatile float subnormal = 1e-40f, one = 1.0f;
  return subnormal * one;
}

TEST(FloatEnvTest, FlushesInTheThreadThatAsksAndTheThreadsItStartsAfter) {
  std::thread([] {
    EXPECT_FALSE(FlushesSubnormals());
    EXPECT_GT(SubnormalProduct(), 0.0f);  // the default keeps subnormals
    EXPECT_GT(SubnormalOperandTimesOne(), 0.0f);
    FlushSubnormalsToZero();
    EXPECT_TRUE(FlushesSubnormals());
    EXPECT_EQ(SubnormalProduct(), 0.0f);
    EXPECT_EQ(SubnormalOperandTimesOne(), 0.0f);
    volatile float normal = 1e-30f;
    EXPECT_EQ(normal * 2.0f, 2e-30f);  // normal numbers are untouched
    std::thread([] {
      EXPECT_TRUE(FlushesSubnormals());
      EXPECT_EQ(SubnormalProduct(), 0.0f);
    }).join();
  }).join();
}

}  // namespace
}  // namespace freeride
