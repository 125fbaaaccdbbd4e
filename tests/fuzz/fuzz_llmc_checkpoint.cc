// llm.c model files (v3 and v5 headers): read, or refused for their header or size.
#include "models/llmc_checkpoint.h"
#include "tests/fuzz/fuzz_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = freeride::fuzz::WriteInput("model.bin", data, size);
  freeride::ReadLlmcModelConfig(path).status().IgnoreError();
  freeride::ReadLlmcModel(path).status().IgnoreError();
  return 0;
}
