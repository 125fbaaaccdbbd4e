// llm.c token shards: read, or refused for their header, version or length.
#include "tests/fuzz/fuzz_files.h"
#include "trainer/data/token_shards.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = freeride::fuzz::WriteInput("shard.bin", data, size);
  freeride::ReadTokenShard(path).status().IgnoreError();
  return 0;
}
