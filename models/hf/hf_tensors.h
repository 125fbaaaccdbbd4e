// Hugging Face tensors read by name, as every family's import reads them (hf_gpt2.h,
// hf_llama.h): the reader, a tensor checked against the shape the config needs, and a tied
// head's lm_head.weight checked against the embedding.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/gpt2_config.h"

namespace freeride {

// A tensor read by name: its shape and fp32 values, or NotFound.
struct HfTensorValues {
  std::vector<int64_t> shape;
  std::vector<float> values;
};
using HfTensorReader = std::function<absl::StatusOr<HfTensorValues>(const std::string& name)>;

// "[d0, d1, ...]", as the import's errors print shapes.
std::string HfShape(const std::vector<int64_t>& shape);

// Tensor `name` if its shape is `shape`, else an error naming it and both shapes.
absl::StatusOr<HfTensorValues> ReadHfTensor(const HfTensorReader& read, const std::string& name,
                                            const std::vector<int64_t>& shape);

// OK when lm_head.weight is [vocab_size, n_embd] and equal, bit for bit, to the embedding
// `wte` already read; else InvalidArgument with `mismatch` as its message.
absl::Status CheckHfHeadTied(const HfTensorReader& read, const GPT2Config& config,
                             const float* wte, const std::string& mismatch);

}  // namespace freeride
