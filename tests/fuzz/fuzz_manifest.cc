// A checkpoint's manifest.json as `checkpoint verify` and the loaders read it, beside a model.bin.
#include <filesystem>

#include "models/checkpoint_verify.h"
#include "tests/fuzz/fuzz_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = freeride::fuzz::ScratchDir() + "/step_00000010";
  static const bool made = [&] {
    std::filesystem::create_directories(dir);
    const uint8_t weights[] = {1, 2, 3};
    freeride::fuzz::WriteInput("model.bin", weights, sizeof(weights), dir);
    return true;
  }();
  (void)made;
  freeride::fuzz::WriteInput(freeride::kManifestFileName, data, size, dir);
  freeride::VerifyCheckpoint(dir).status().IgnoreError();
  freeride::VerifyCheckpointFile(dir, "model.bin").IgnoreError();
  return 0;
}
