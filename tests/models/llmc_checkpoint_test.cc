#include "models/llmc_checkpoint.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"

namespace freeride {
namespace {

std::string TempPath(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) / name).string();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string Header(int magic, int version, const GPT2Config& c) {
  int32_t h[256] = {magic, version, (int32_t)c.max_seq_len, (int32_t)c.vocab_size,
                    (int32_t)c.n_layer, (int32_t)c.n_head, (int32_t)c.n_embd,
                    (int32_t)c.padded_vocab_size};
  return std::string(reinterpret_cast<char*>(h), sizeof(h));
}

TEST(LlmcCheckpointTest, Fp32RoundTrip) {
  const GPT2Config c = *MakeGPT2Config(2, 2, 8, 16, 100);
  std::vector<float> params(NumParameters(c));
  for (size_t i = 0; i < params.size(); ++i) params[i] = 0.001f * static_cast<float>(i);
  const std::string path = TempPath("rt.bin");
  ASSERT_TRUE(WriteLlmcModel(path, c, params.data()).ok());
  EXPECT_EQ(std::filesystem::file_size(path), 1024 + params.size() * 4);
  auto model = ReadLlmcModel(path);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->config, c);
  EXPECT_EQ(model->params, params);
}

TEST(LlmcCheckpointTest, ReadsBf16Version5) {
  const GPT2Config c = *MakeGPT2Config(1, 1, 4, 4, 10);
  const int64_t n = NumParameters(c);
  std::string bytes = Header(kLlmcModelMagic, 5, c);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t one_and_half = 0x3FC0;  // bf16 1.5
    bytes.append(reinterpret_cast<const char*>(&one_and_half), 2);
  }
  const std::string path = TempPath("bf16.bin");
  WriteBytes(path, bytes);
  auto model = ReadLlmcModel(path);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->params.size(), static_cast<size_t>(n));
  EXPECT_EQ(model->params[n - 1], 1.5f);
}

TEST(LlmcCheckpointTest, BadFilesGiveClearErrors) {
  const GPT2Config c = *MakeGPT2Config(1, 1, 4, 4, 10);
  const std::string path = TempPath("bad.bin");
  WriteBytes(path, Header(12345, 3, c));
  EXPECT_NE(ReadLlmcModel(path).status().message().find("magic 12345, expected 20240326"),
            std::string::npos);
  WriteBytes(path, Header(kLlmcModelMagic, 4, c));
  EXPECT_NE(ReadLlmcModel(path).status().message().find("version 4 is not supported"),
            std::string::npos);
  WriteBytes(path, Header(kLlmcModelMagic, 3, c) + std::string(100, '\0'));
  EXPECT_NE(ReadLlmcModel(path).status().message().find("(truncated)"), std::string::npos);
  WriteBytes(path, "short");
  EXPECT_NE(ReadLlmcModel(path).status().message().find("shorter than the 1024-byte"),
            std::string::npos);
  EXPECT_EQ(ReadLlmcModel(TempPath("missing.bin")).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace freeride
