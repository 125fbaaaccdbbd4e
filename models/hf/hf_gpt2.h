// The GPT-2 family's side of the Hugging Face exchange: its config.json (GPT2LMHeadModel) and
// the map between llm.c's parameter buffer (models/gpt2_config.h) and the tensors that class
// loads. HF's GPT-2 computes its projections with Conv1D, x·W + b with W stored [in, out],
// where llm.c stores [out, in] (nn.Linear's layout): the four matrices of a block are
// transposed on the way. The embedding is stored without llm.c's padded rows, and the head is
// tied to it, so no lm_head.weight is written. Another family (Llama) gets a file of its own
// with the same four functions.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/gpt2_config.h"
#include "models/hf/hf_tensors.h"
#include "models/hf/safetensors.h"

namespace freeride {

// config.json's model_type of this family.
inline constexpr char kGpt2ModelType[] = "gpt2";

// config.json for `config`, weights stored as `torch_dtype` ("float32", "bfloat16", "float16").
nlohmann::ordered_json Gpt2HfConfig(const GPT2Config& config, const std::string& torch_dtype);

// The model shape config.json describes; an error names the key (file `where`) whose value
// freeride's GPT-2 cannot compute as the file says (another activation, epsilon, inner size,
// untied head).
absl::StatusOr<GPT2Config> Gpt2ConfigFromHf(const nlohmann::json& config, const std::string& where);

// The whole model's parameters (llm.c order, `NumParameters(config)` values) as HF tensors, in
// the order GPT2LMHeadModel.state_dict() lists them.
std::vector<SafetensorsTensor> Gpt2ToHf(const GPT2Config& config, const float* params);

// The whole model's parameters (llm.c order; padded embedding rows zero) from HF tensors.
// Names are taken with or without the "transformer." prefix (GPT2LMHeadModel's and GPT2Model's
// files); `names` are every tensor the files hold: one that the model does not use is an error
// naming it, except the attention masks old files carry (attn.bias, attn.masked_bias), and an
// lm_head.weight must equal the embedding (freeride's head is tied). A missing tensor or a
// shape other than the config's is an error naming the tensor.
absl::StatusOr<std::vector<float>> Gpt2FromHf(const GPT2Config& config,
                                              const std::vector<std::string>& names,
                                              const HfTensorReader& read);

}  // namespace freeride
