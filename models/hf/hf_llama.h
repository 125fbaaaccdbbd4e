// The Llama family's side of the Hugging Face exchange: its config.json (LlamaForCausalLM) and
// the map between freeride's parameter buffer (models/gpt2_config.h) and the tensors that class
// loads. Both store matrices [out, in] and rotate q and k in the same (rotate-half) layout, so
// no tensor is transposed or permuted: the fused qkvw splits into q_proj, k_proj and v_proj,
// fcw into gate_proj and up_proj. The embedding (and an untied head) is stored without
// freeride's padded rows; a tied head writes no lm_head.weight.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/gpt2_config.h"
#include "models/hf/hf_gpt2.h"
#include "models/hf/safetensors.h"

namespace freeride {

// config.json's model_type of this family.
inline constexpr char kLlamaModelType[] = "llama";

// config.json for a Llama-family `config`, weights stored as `torch_dtype`.
nlohmann::ordered_json LlamaHfConfig(const GPT2Config& config, const std::string& torch_dtype);

// The model config.json describes; an error names the key (file `where`) whose value
// freeride's Llama cannot compute as the file says (another activation, biases, rope scaling,
// a head size other than hidden_size / num_attention_heads).
absl::StatusOr<GPT2Config> LlamaConfigFromHf(const nlohmann::json& config,
                                             const std::string& where);

// The whole model's parameters as HF tensors, in LlamaForCausalLM.state_dict()'s order.
std::vector<SafetensorsTensor> LlamaToHf(const GPT2Config& config, const float* params);

// The whole model's parameters (padded vocabulary rows zero) from HF tensors. `names` are every
// tensor the files hold: one the model does not use is an error naming it (rotary inv_freq
// buffers aside); a missing tensor or a shape other than the config's is an error naming the
// tensor; with a tied head an lm_head.weight must equal the embedding.
absl::StatusOr<std::vector<float>> LlamaFromHf(const GPT2Config& config,
                                               const std::vector<std::string>& names,
                                               const HfTensorReader& read);

}  // namespace freeride
