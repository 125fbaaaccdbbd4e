// The messages between pipeline stages (a micro-batch's activations [B·T·C] and their
// gradients): their element type, their memory, and the host's conversions to and from fp32.
//
// A message holds the chunk's own activation type: fp32 on the CPU and on fp32 CUDA chunks,
// bf16 on bf16 CUDA chunks. A bf16 pipeline so sends half the bytes, and the values sent are
// the activations themselves: the same numbers as widening them to fp32 and rounding back
// (Bf16Bits(FloatOfBf16(b)) == b for every non-NaN b, stage_message_test.cc).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace freeride {

enum class MessageType { kFp32, kBf16 };

inline int MessageTypeBytes(MessageType type) { return type == MessageType::kBf16 ? 2 : 4; }
inline const char* MessageTypeName(MessageType type) {
  return type == MessageType::kBf16 ? "bf16" : "fp32";
}

// Where a message lives: host memory, for transports that take host memory (MPI, the in-process
// and emulated ones), or the chunk's device memory, for one that carries device memory (NCCL:
// Transport::CarriesDeviceMemory); a chunk without a device (the CPU) gives host memory either
// way.
enum class MessageMemory { kHost, kDevice };

// One message's memory, allocated by the chunk that fills or reads it (on CUDA pinned host
// memory, so that the device copies are DMA, or device memory) and freed by its own deleter.
using MessageBuffer = std::unique_ptr<void, void (*)(void*)>;

// Plain host memory for a message of `bytes` (null when it cannot be had).
inline MessageBuffer AllocateHostMessage(int64_t bytes) {
  return MessageBuffer(std::malloc(static_cast<size_t>(bytes)), std::free);
}

// bf16 as the CUDA kernels make it (__float2bfloat16_rn): fp32 rounded to nearest, ties to
// even; NaN becomes the canonical quiet NaN 0x7FFF, as the device's conversion makes it.
inline uint16_t Bf16Bits(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFF;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float FloatOfBf16(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f = 0;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// `n` fp32 values into a message of `type` (rounded to bf16 where it is bf16), and back.
inline void ToMessage(MessageType type, const float* src, int64_t n, void* dst) {
  if (type == MessageType::kFp32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  uint16_t* out = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) out[i] = Bf16Bits(src[i]);
}
inline void FromMessage(MessageType type, const void* src, int64_t n, float* dst) {
  if (type == MessageType::kFp32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const uint16_t* in = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatOfBf16(in[i]);
}

}  // namespace freeride
