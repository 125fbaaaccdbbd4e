// What the fuzz targets share: the input written to a file of this process's scratch
// directory, for readers that take a path.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace freeride::fuzz {

// The scratch directory of this process (under $TMPDIR or /tmp), made once.
inline const std::string& ScratchDir() {
  static const std::string dir = [] {
    const std::filesystem::path d = std::filesystem::temp_directory_path() /
                                    ("freeride_fuzz_" + std::to_string(getpid()));
    std::filesystem::create_directories(d);
    return d.string();
  }();
  return dir;
}

// Writes `size` bytes at `data` to `name` in the scratch directory (or in `dir`); its path.
inline std::string WriteInput(const std::string& name, const uint8_t* data, size_t size,
                              const std::string& dir = ScratchDir()) {
  const std::string path = (std::filesystem::path(dir) / name).string();
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

}  // namespace freeride::fuzz
