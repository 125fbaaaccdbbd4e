// CRC-32C (Castagnoli) of bytes and of files: what checkpoints record of each file they hold, so
// that a file changed on disk after it was written (a bad sector, a torn copy, a stray write)
// is found before it is trusted. A checksum detects corruption, not tampering: whoever can
// rewrite a file can rewrite the manifest that holds its checksum too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace freeride {

// Extends `crc` (the CRC-32C of the bytes before, 0 for none) by `size` bytes.
uint32_t Crc32c(const void* data, size_t size, uint32_t crc = 0);

struct FileChecksum {
  int64_t bytes = 0;
  uint32_t crc32c = 0;
};

// Reads `path` through once; an error names the file.
absl::StatusOr<FileChecksum> ChecksumFile(const std::string& path);

// "1a2b3c4d": how manifests spell a CRC-32C.
std::string Crc32cHex(uint32_t crc);

}  // namespace freeride
