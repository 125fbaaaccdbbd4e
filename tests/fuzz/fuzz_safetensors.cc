// safetensors files: parsed and every tensor read, or refused for their header (length, JSON,
// dtypes, shapes, offsets).
#include <string>

#include "models/hf/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string file(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<freeride::SafetensorsHeader> header =
      freeride::ParseSafetensors(file, "model.safetensors");
  if (!header.ok()) return 0;
  for (const freeride::SafetensorsEntry& tensor : header->tensors) {
    freeride::SafetensorsFloats(file, *header, tensor, "model.safetensors").status().IgnoreError();
  }
  return 0;
}
