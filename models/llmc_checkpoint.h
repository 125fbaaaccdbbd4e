// llm.c model checkpoints: a 256 × int32 header (magic 20240326; version 3 = fp32 weights,
// 5 = bf16; max_seq_len, vocab_size, n_layer, n_head, n_embd, padded_vocab_size) followed by
// every parameter in llm.c's order (models/gpt2_config.h). Weights move between this project,
// llm.c and PyTorch exports unchanged. A Llama-family model's file is this project's own: ints
// 8.. of the header say the family (1) and its shape, where llm.c's GPT-2 files hold zeros.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/gpt2_config.h"

namespace freeride {

inline constexpr int kLlmcModelMagic = 20240326;
inline constexpr int kLlmcModelVersionFp32 = 3;
inline constexpr int kLlmcModelVersionBf16 = 5;

struct LlmcModel {
  GPT2Config config;
  std::vector<float> params;  // the whole model, llm.c order (bf16 files are widened)
};

// Reads only the header: the architecture a checkpoint declares.
absl::StatusOr<GPT2Config> ReadLlmcModelConfig(const std::string& path);
// Reads the whole file. Errors name the file and say what was wrong (magic, version, size).
absl::StatusOr<LlmcModel> ReadLlmcModel(const std::string& path);
// Writes fp32 (version 3), atomically (temporary name, then rename).
absl::Status WriteLlmcModel(const std::string& path, const GPT2Config& config,
                            const float* params);

// Copies a stage's tensors out of (or into) the whole model's parameter buffer.
void CopyStageFromWhole(const GPT2Config& config, const StageSpec& stage, const float* whole,
                        float* stage_params);
void CopyStageToWhole(const GPT2Config& config, const StageSpec& stage, const float* stage_params,
                      float* whole);

}  // namespace freeride
