// Hugging Face's safetensors format: an 8-byte little-endian header length N, N bytes of JSON
// ({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {string: string}}), then
// the data buffer the offsets index. The reader trusts nothing in the header: every tensor's
// dtype must be known, its offsets inside the buffer, its byte length its shape's elements
// times its dtype's size, and the tensors must tile the buffer (no overlap, no gap, as the
// reference implementation requires); an error names the file and the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace freeride {

// Bytes per element of a safetensors dtype ("F32", "BF16", ...), or 0 for a name it does not
// have.
int SafetensorsDtypeBytes(absl::string_view dtype);

struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  // into the data buffer
  int64_t elements() const;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // in buffer order
  std::map<std::string, std::string> metadata;
  int64_t data_start = 0;  // 8 + N: where the buffer starts in the file
  const SafetensorsEntry* Find(absl::string_view name) const;
};

// Parses and checks the header of a whole safetensors file's bytes; `where` names the file.
absl::StatusOr<SafetensorsHeader> ParseSafetensors(absl::string_view file, absl::string_view where);

// A tensor's values widened to fp32 (F32, F16 and BF16; other dtypes are refused by name).
absl::StatusOr<std::vector<float>> SafetensorsFloats(absl::string_view file,
                                                     const SafetensorsHeader& header,
                                                     const SafetensorsEntry& tensor,
                                                     absl::string_view where);

// fp32 to and from IEEE half (rounded to nearest, ties to even; overflow to infinity).
uint16_t HalfBits(float f);
float FloatOfHalf(uint16_t bits);

// One tensor to write, fp32 in memory, stored as the file's dtype.
struct SafetensorsTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// The bytes of a safetensors file holding `tensors` in order, as `dtype` ("F32", "BF16" or
// "F16"; bf16 and fp16 rounded to nearest even), with `metadata`. The header is padded with
// spaces to a multiple of 8 bytes, as the reference writer does, so the buffer is aligned.
absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<const SafetensorsTensor*>& tensors, absl::string_view dtype,
    const std::map<std::string, std::string>& metadata);

}  // namespace freeride
