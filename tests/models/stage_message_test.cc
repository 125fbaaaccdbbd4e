// The messages between stages (models/stage_message.h): bf16 messages carry the activations
// themselves, the same numbers the fp32 messages carried after the device rounded them back;
// the host's rounding is the device's (nearest, ties to even, one canonical NaN).
#include "models/stage_message.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace freeride {
namespace {

bool IsNanBits(uint16_t b) { return (b & 0x7F80) == 0x7F80 && (b & 0x007F) != 0; }

TEST(StageMessageTest, Bf16ThroughFp32AndBackIsTheIdentity) {
  // Every bf16 value: widened to fp32 (the old message) and rounded back on the receiving
  // device, it is the value a bf16 message carries. NaNs stay NaN (the canonical one).
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const uint16_t back = Bf16Bits(FloatOfBf16(bits));
    if (IsNanBits(bits)) {
      EXPECT_EQ(back, 0x7FFF) << std::hex << b;
    } else {
      ASSERT_EQ(back, bits) << std::hex << b;
    }
  }
}

// The bf16 neighbour of |x| below (truncation) and above, as doubles; above the largest
// finite bf16 the next value is 2^128 (where IEEE rounding to nearest overflows to infinity).
double Bf16Magnitude(uint16_t bits) {
  return (bits & 0x7FFF) == 0x7F80 ? std::ldexp(1.0, 128) : std::fabs(FloatOfBf16(bits));
}

TEST(StageMessageTest, RoundsToNearestTiesToEvenAgainstFloat64) {
  std::mt19937 rng(5);
  // Signed zeros, two ties (1 + 2^-8, 1 + 3·2^-8), the largest finite bf16 and fp32 (which
  // overflows to infinity), subnormals, infinities.
  std::vector<float> xs = {0.0f,        -0.0f,         1.0f,           1.00390625f,
                           1.01171875f, 3.3895314e38f, -3.3895314e38f, 3.4028235e38f,
                           1e-40f,      -1e-40f,       INFINITY,       -INFINITY};
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = rng();
    float x = 0;
    std::memcpy(&x, &u, 4);
    if (std::isnan(x)) continue;
    xs.push_back(x);
  }
  for (int i = 0; i < 20000; ++i) {  // exact ties: the low 16 bits 0x8000
    uint32_t u = (rng() & 0x7F7F0000u) | 0x8000u;
    float x = 0;
    std::memcpy(&x, &u, 4);
    xs.push_back(x);
  }
  for (float x : xs) {
    uint32_t u = 0;
    std::memcpy(&u, &x, 4);
    const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
    const uint16_t lo = static_cast<uint16_t>((u >> 16) & 0x7FFF);
    uint16_t want = lo;
    if (lo != 0x7F80) {  // infinities are exact
      const double a = std::fabs(static_cast<double>(x));
      const double below = a - Bf16Magnitude(lo), above = Bf16Magnitude(lo + 1) - a;
      if (above < below || (above == below && (lo & 1) == 1)) want = lo + 1;
    }
    ASSERT_EQ(Bf16Bits(x), static_cast<uint16_t>(sign | want)) << x;
  }
  EXPECT_EQ(Bf16Bits(NAN), 0x7FFF);
}

TEST(StageMessageTest, MessagesHoldTheirTypesElements) {
  EXPECT_EQ(MessageTypeBytes(MessageType::kFp32), 4);
  EXPECT_EQ(MessageTypeBytes(MessageType::kBf16), 2);
  const std::vector<float> values = {1.0f, -2.5f, 3.14159265f, 1e-3f, 65504.0f};
  const int64_t n = static_cast<int64_t>(values.size());
  std::vector<float> back(n);
  for (MessageType type : {MessageType::kFp32, MessageType::kBf16}) {
    MessageBuffer message = AllocateHostMessage(n * MessageTypeBytes(type));
    ASSERT_NE(message, nullptr);
    ToMessage(type, values.data(), n, message.get());
    FromMessage(type, message.get(), n, back.data());
    for (int64_t i = 0; i < n; ++i) {
      const float want = type == MessageType::kFp32 ? values[i] : FloatOfBf16(Bf16Bits(values[i]));
      EXPECT_EQ(back[i], want) << MessageTypeName(type) << " " << i;
      if (type == MessageType::kBf16) {
        EXPECT_EQ(static_cast<const uint16_t*>(message.get())[i], Bf16Bits(values[i]));
      }
    }
  }
}

}  // namespace
}  // namespace freeride
