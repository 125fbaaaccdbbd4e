#include "models/hf/hf_gpt2.h"

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

constexpr char kPrefix[] = "transformer.";

// One HF tensor and where its values live in llm.c's buffer.
struct Mapping {
  std::string name;  // without the "transformer." prefix (lm_head is the head's own)
  ParamTensor tensor;
  int64_t layer = -1;          // per-layer tensors
  std::vector<int64_t> shape;  // HF's
  bool transposed = false;     // HF [in, out] of llm.c's [out, in]
};

std::vector<Mapping> Mappings(const GPT2Config& c) {
  const int64_t C = c.n_embd;
  std::vector<Mapping> out = {{"wte.weight", ParamTensor::kWte, -1, {c.vocab_size, C}},
                              {"wpe.weight", ParamTensor::kWpe, -1, {c.max_seq_len, C}}};
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string h = absl::StrCat("h.", l, ".");
    out.push_back({h + "ln_1.weight", ParamTensor::kLn1W, l, {C}});
    out.push_back({h + "ln_1.bias", ParamTensor::kLn1B, l, {C}});
    out.push_back({h + "attn.c_attn.weight", ParamTensor::kQkvW, l, {C, 3 * C}, true});
    out.push_back({h + "attn.c_attn.bias", ParamTensor::kQkvB, l, {3 * C}});
    out.push_back({h + "attn.c_proj.weight", ParamTensor::kAttProjW, l, {C, C}, true});
    out.push_back({h + "attn.c_proj.bias", ParamTensor::kAttProjB, l, {C}});
    out.push_back({h + "ln_2.weight", ParamTensor::kLn2W, l, {C}});
    out.push_back({h + "ln_2.bias", ParamTensor::kLn2B, l, {C}});
    out.push_back({h + "mlp.c_fc.weight", ParamTensor::kFcW, l, {C, 4 * C}, true});
    out.push_back({h + "mlp.c_fc.bias", ParamTensor::kFcB, l, {4 * C}});
    out.push_back({h + "mlp.c_proj.weight", ParamTensor::kFcProjW, l, {4 * C, C}, true});
    out.push_back({h + "mlp.c_proj.bias", ParamTensor::kFcProjB, l, {C}});
  }
  out.push_back({"ln_f.weight", ParamTensor::kLnfW, -1, {C}});
  out.push_back({"ln_f.bias", ParamTensor::kLnfB, -1, {C}});
  return out;
}

// Where tensor `m` starts in the whole model's buffer.
int64_t OffsetOf(const ParamLayout& layout, const GPT2Config& c, const Mapping& m) {
  int64_t at = layout.slot(m.tensor).offset;
  if (m.layer >= 0) at += m.layer * ParamElements(c, m.tensor);
  return at;
}

}  // namespace

nlohmann::ordered_json Gpt2HfConfig(const GPT2Config& c, const std::string& torch_dtype) {
  nlohmann::ordered_json json = {{"architectures", {"GPT2LMHeadModel"}},
                                 {"model_type", kGpt2ModelType},
                                 {"vocab_size", c.vocab_size},
                                 {"n_positions", c.max_seq_len},
                                 {"n_ctx", c.max_seq_len},
                                 {"n_embd", c.n_embd},
                                 {"n_layer", c.n_layer},
                                 {"n_head", c.n_head},
                                 {"n_inner", nullptr},
                                 // The tanh approximation of GELU, which is what freeride computes.
                                 {"activation_function", "gelu_new"},
                                 {"layer_norm_epsilon", 1e-5},
                                 {"initializer_range", 0.02},
                                 // freeride trains without dropout.
                                 {"resid_pdrop", 0.0},
                                 {"embd_pdrop", 0.0},
                                 {"attn_pdrop", 0.0},
                                 {"scale_attn_weights", true},
                                 {"scale_attn_by_inverse_layer_idx", false},
                                 {"reorder_and_upcast_attn", false},
                                 {"tie_word_embeddings", true},
                                 {"use_cache", true},
                                 {"torch_dtype", torch_dtype}};
  // GPT-2's tokenizer: <|endoftext|> begins and ends text (only where the vocabulary has it).
  if (c.vocab_size > 50256) {
    json["bos_token_id"] = 50256;
    json["eos_token_id"] = 50256;
  }
  return json;
}

absl::StatusOr<GPT2Config> Gpt2ConfigFromHf(const nlohmann::json& json, const std::string& where) {
  JsonFields f(json, where);
  int64_t v[5];
  const char* keys[5] = {"n_layer", "n_head", "n_embd", "n_positions", "vocab_size"};
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<int64_t> value = f.Int(keys[i], 1, 1 << 24);
    if (!value.ok()) return value.status();
    v[i] = *value;
  }
  auto refuse = [&](const std::string& key, const std::string& found, const std::string& want) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %s = %s: freeride's GPT-2 computes %s", where, key, found, want));
  };
  absl::StatusOr<std::string> act = f.StringOr("activation_function", "gelu_new");
  if (!act.ok()) return act.status();
  if (*act != "gelu_new" && *act != "gelu_pytorch_tanh") {
    return refuse("activation_function", *act, "gelu_new (GELU's tanh approximation)");
  }
  absl::StatusOr<double> eps = f.NumberOr("layer_norm_epsilon", 1e-5);
  if (!eps.ok()) return eps.status();
  if (*eps != 1e-5) return refuse("layer_norm_epsilon", absl::StrCat(*eps), "1e-05");
  if (f.Has("n_inner") && !f.IsNull("n_inner")) {
    absl::StatusOr<int64_t> inner = f.Int("n_inner");
    if (!inner.ok()) return inner.status();
    if (*inner != 4 * v[2]) {
      return refuse("n_inner", absl::StrCat(*inner), absl::StrCat("4 · n_embd = ", 4 * v[2]));
    }
  }
  for (const auto& [key, want] :
       std::vector<std::pair<std::string, bool>>{{"tie_word_embeddings", true},
                                                 {"scale_attn_weights", true},
                                                 {"scale_attn_by_inverse_layer_idx", false}}) {
    if (!f.Has(key)) continue;
    absl::StatusOr<bool> value = f.Bool(key);
    if (!value.ok()) return value.status();
    if (*value != want) return refuse(key, *value ? "true" : "false", want ? "true" : "false");
  }
  absl::StatusOr<GPT2Config> config = MakeGPT2Config(v[0], v[1], v[2], v[3], v[4]);
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", config.status().message()));
  }
  return config;
}

std::vector<SafetensorsTensor> Gpt2ToHf(const GPT2Config& c, const float* params) {
  const ParamLayout layout = MakeParamLayout(c, WholeModel(c));
  std::vector<SafetensorsTensor> out;
  for (const Mapping& m : Mappings(c)) {
    SafetensorsTensor t{kPrefix + m.name, m.shape, {}};
    const float* src = params + OffsetOf(layout, c, m);
    int64_t n = 1;
    for (int64_t d : m.shape) n *= d;
    t.values.resize(n);
    if (m.transposed) {
      // llm.c [out, in] → HF [in, out].
      const int64_t in = m.shape[0], outs = m.shape[1];
      for (int64_t i = 0; i < in; ++i) {
        for (int64_t o = 0; o < outs; ++o) t.values[i * outs + o] = src[o * in + i];
      }
    } else {
      std::memcpy(t.values.data(), src, n * sizeof(float));
    }
    out.push_back(std::move(t));
  }
  return out;
}

absl::StatusOr<std::vector<float>> Gpt2FromHf(const GPT2Config& c,
                                              const std::vector<std::string>& names,
                                              const HfTensorReader& read) {
  const ParamLayout layout = MakeParamLayout(c, WholeModel(c));
  const std::vector<Mapping> mappings = Mappings(c);
  // Each name as the file spells it, by its name without the prefix.
  std::map<std::string, std::string> spelled;
  std::vector<std::string> unused;
  std::set<std::string> known;
  for (const Mapping& m : mappings) known.insert(m.name);
  for (const std::string& name : names) {
    const std::string bare =
        absl::StartsWith(name, kPrefix) ? name.substr(std::strlen(kPrefix)) : name;
    if (known.count(bare) != 0) {
      if (!spelled.emplace(bare, name).second) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "tensors \"%s\" and \"%s\" are the same parameter", spelled[bare], name));
      }
    } else if (name != "lm_head.weight" && !absl::EndsWith(name, ".attn.bias") &&
               !absl::EndsWith(name, ".attn.masked_bias")) {
      unused.push_back(name);
    }
  }
  if (!unused.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tensor%s %s: not part of a GPT-2 of %d layers (GPT2LMHeadModel)",
                        unused.size() > 1 ? "s" : "", absl::StrJoin(unused, ", "), c.n_layer));
  }
  std::vector<float> params(NumParameters(c), 0.0f);
  for (const Mapping& m : mappings) {
    auto it = spelled.find(m.name);
    if (it == spelled.end()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tensor \"%s%s\" %s is missing", kPrefix, m.name, HfShape(m.shape)));
    }
    absl::StatusOr<HfTensorValues> t = ReadHfTensor(read, it->second, m.shape);
    if (!t.ok()) return t.status();
    float* dst = params.data() + OffsetOf(layout, c, m);
    if (m.transposed) {
      const int64_t in = m.shape[0], outs = m.shape[1];
      for (int64_t i = 0; i < in; ++i) {
        for (int64_t o = 0; o < outs; ++o) dst[o * in + i] = t->values[i * outs + o];
      }
    } else {
      std::memcpy(dst, t->values.data(), t->values.size() * sizeof(float));
    }
  }
  if (std::find(names.begin(), names.end(), "lm_head.weight") != names.end()) {
    const absl::Status tied = CheckHfHeadTied(
        read, c, params.data() + layout.slot(ParamTensor::kWte).offset,
        "tensor \"lm_head.weight\" differs from the embedding \"transformer.wte.weight\": "
        "freeride's GPT-2 ties its head to the embedding");
    if (!tied.ok()) return tied;
  }
  return params;
}

}  // namespace freeride
