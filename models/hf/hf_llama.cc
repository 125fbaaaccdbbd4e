#include "models/hf/hf_llama.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/json_fields.h"

namespace freeride {
namespace {

// One HF tensor: rows [row, row + shape[0]) of a freeride tensor (of `layer` when per-layer).
struct Mapping {
  std::string name;
  ParamTensor tensor;
  int64_t layer = -1;
  int64_t row = 0;
  std::vector<int64_t> shape;
};

std::vector<Mapping> Mappings(const GPT2Config& c) {
  const int64_t C = c.n_embd, KV = c.kv_dim(), F = c.ffn_hidden;
  std::vector<Mapping> out = {
      {"model.embed_tokens.weight", ParamTensor::kWte, -1, 0, {c.vocab_size, C}}};
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string h = absl::StrCat("model.layers.", l, ".");
    out.push_back({h + "self_attn.q_proj.weight", ParamTensor::kQkvW, l, 0, {C, C}});
    out.push_back({h + "self_attn.k_proj.weight", ParamTensor::kQkvW, l, C, {KV, C}});
    out.push_back({h + "self_attn.v_proj.weight", ParamTensor::kQkvW, l, C + KV, {KV, C}});
    out.push_back({h + "self_attn.o_proj.weight", ParamTensor::kAttProjW, l, 0, {C, C}});
    out.push_back({h + "mlp.gate_proj.weight", ParamTensor::kFcW, l, 0, {F, C}});
    out.push_back({h + "mlp.up_proj.weight", ParamTensor::kFcW, l, F, {F, C}});
    out.push_back({h + "mlp.down_proj.weight", ParamTensor::kFcProjW, l, 0, {C, F}});
    out.push_back({h + "input_layernorm.weight", ParamTensor::kLn1W, l, 0, {C}});
    out.push_back({h + "post_attention_layernorm.weight", ParamTensor::kLn2W, l, 0, {C}});
  }
  out.push_back({"model.norm.weight", ParamTensor::kLnfW, -1, 0, {C}});
  if (!c.tie_embeddings) {
    out.push_back({"lm_head.weight", ParamTensor::kLmHead, -1, 0, {c.vocab_size, C}});
  }
  return out;
}

// Where tensor `m` starts in the whole model's buffer. A matrix's rows are its last dimension
// wide (a vector is one row).
int64_t OffsetOf(const ParamLayout& layout, const GPT2Config& c, const Mapping& m) {
  int64_t at = layout.slot(m.tensor).offset + m.row * m.shape.back();
  if (m.layer >= 0) at += m.layer * ParamElements(c, m.tensor);
  return at;
}

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

nlohmann::ordered_json LlamaHfConfig(const GPT2Config& c, const std::string& torch_dtype) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", kLlamaModelType},
          {"vocab_size", c.vocab_size},
          {"hidden_size", c.n_embd},
          {"intermediate_size", c.ffn_hidden},
          {"num_hidden_layers", c.n_layer},
          {"num_attention_heads", c.n_head},
          {"num_key_value_heads", c.n_kv_head},
          {"head_dim", c.head_size()},
          {"max_position_embeddings", c.max_seq_len},
          {"hidden_act", "silu"},
          {"rms_norm_eps", c.norm_eps},
          {"rope_theta", c.rope_theta},
          {"rope_scaling", nullptr},
          {"attention_bias", false},
          {"mlp_bias", false},
          {"attention_dropout", 0.0},
          {"initializer_range", 0.02},
          {"tie_word_embeddings", c.tie_embeddings},
          {"use_cache", true},
          {"torch_dtype", torch_dtype}};
}

absl::StatusOr<GPT2Config> LlamaConfigFromHf(const nlohmann::json& json, const std::string& where) {
  JsonFields f(json, where);
  int64_t v[6];
  const char* keys[6] = {"num_hidden_layers",       "num_attention_heads", "hidden_size",
                         "max_position_embeddings", "vocab_size",          "intermediate_size"};
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<int64_t> value = f.Int(keys[i], 1, 1 << 24);
    if (!value.ok()) return value.status();
    v[i] = *value;
  }
  absl::StatusOr<int64_t> kv = f.IntOr("num_key_value_heads", v[1], 1, 1 << 24);
  if (!kv.ok()) return kv.status();
  absl::StatusOr<double> eps = f.NumberOr("rms_norm_eps", 1e-6);
  if (!eps.ok()) return eps.status();
  absl::StatusOr<double> theta = f.NumberOr("rope_theta", 10000.0);
  if (!theta.ok()) return theta.status();
  absl::StatusOr<std::string> act = f.StringOr("hidden_act", "silu");
  if (!act.ok()) return act.status();
  auto refuse = [&](const std::string& key, const std::string& found, const std::string& want) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %s = %s: freeride's Llama computes %s", where, key, found, want));
  };
  if (*act != "silu") return refuse("hidden_act", *act, "silu (SwiGLU)");
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (!f.Has(key)) continue;
    absl::StatusOr<bool> bias = f.Bool(key);
    if (!bias.ok()) return bias.status();
    if (*bias) return refuse(key, "true", "no biases");
  }
  if (f.Has("rope_scaling") && !f.IsNull("rope_scaling")) {
    return refuse("rope_scaling", json["rope_scaling"].dump(), "unscaled rotary embeddings");
  }
  if (f.Has("head_dim") && !f.IsNull("head_dim")) {
    absl::StatusOr<int64_t> head_dim = f.Int("head_dim");
    if (!head_dim.ok()) return head_dim.status();
    if (v[1] > 0 && *head_dim * v[1] != v[2]) {
      return refuse("head_dim", absl::StrCat(*head_dim),
                    absl::StrCat("hidden_size / num_attention_heads = ", v[2] / v[1]));
    }
  }
  bool tied = false;  // LlamaConfig's default
  if (f.Has("tie_word_embeddings")) {
    absl::StatusOr<bool> t = f.Bool("tie_word_embeddings");
    if (!t.ok()) return t.status();
    tied = *t;
  }
  absl::StatusOr<GPT2Config> config =
      MakeLlamaConfig(v[0], v[1], *kv, v[2], v[3], v[4], v[5], *theta, *eps, tied);
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", config.status().message()));
  }
  return config;
}

std::vector<SafetensorsTensor> LlamaToHf(const GPT2Config& c, const float* params) {
  const ParamLayout layout = MakeParamLayout(c, WholeModel(c));
  std::vector<SafetensorsTensor> out;
  for (const Mapping& m : Mappings(c)) {
    const float* src = params + OffsetOf(layout, c, m);
    out.push_back({m.name, m.shape, std::vector<float>(src, src + Elements(m.shape))});
  }
  return out;
}

absl::StatusOr<std::vector<float>> LlamaFromHf(const GPT2Config& c,
                                               const std::vector<std::string>& names,
                                               const HfTensorReader& read) {
  const ParamLayout layout = MakeParamLayout(c, WholeModel(c));
  const std::vector<Mapping> mappings = Mappings(c);
  std::set<std::string> known, present(names.begin(), names.end());
  for (const Mapping& m : mappings) known.insert(m.name);
  std::vector<std::string> unused;
  for (const std::string& name : names) {
    const bool tied_head = c.tie_embeddings && name == "lm_head.weight";
    if (known.count(name) == 0 && !tied_head && !absl::EndsWith(name, "rotary_emb.inv_freq")) {
      unused.push_back(name);
    }
  }
  if (!unused.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor%s %s: not part of a Llama of %d layers (LlamaForCausalLM, tie_word_embeddings "
        "= %s)",
        unused.size() > 1 ? "s" : "", absl::StrJoin(unused, ", "), c.n_layer,
        c.tie_embeddings ? "true" : "false"));
  }
  std::vector<float> params(NumParameters(c), 0.0f);
  for (const Mapping& m : mappings) {
    if (present.count(m.name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tensor \"%s\" %s is missing", m.name, HfShape(m.shape)));
    }
    absl::StatusOr<HfTensorValues> t = ReadHfTensor(read, m.name, m.shape);
    if (!t.ok()) return t.status();
    std::memcpy(params.data() + OffsetOf(layout, c, m), t->values.data(),
                t->values.size() * sizeof(float));
  }
  if (c.tie_embeddings && present.count("lm_head.weight") != 0) {
    const absl::Status tied = CheckHfHeadTied(
        read, c, params.data() + layout.slot(ParamTensor::kWte).offset,
        "tensor \"lm_head.weight\" differs from the embedding \"model.embed_tokens.weight\" "
        "but config.json says tie_word_embeddings = true");
    if (!tied.ok()) return tied;
  }
  return params;
}

}  // namespace freeride
