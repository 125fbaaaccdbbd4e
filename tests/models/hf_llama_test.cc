// The Llama family's Hugging Face exchange: a model round trips through LlamaForCausalLM's
// tensors and config.json bit-exact in fp32 (tied and untied, one file or shards), the names
// and shapes are the ones that class loads, and what freeride's Llama cannot compute is
// refused naming the key or the tensor.
#include "models/hf/hf_llama.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/hf/hf_directory.h"
#include "models/llama.h"

namespace freeride {
namespace {

using ::testing::HasSubstr;

std::string HfLlamaTemp(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) / name).string();
}

GPT2Config TinyHfLlama(bool tied) {
  return *MakeLlamaConfig(2, 4, 2, 16, 8, 11, 24, 500000.0, 1e-6, tied);
}

std::vector<float> RandomParams(const GPT2Config& c) {
  std::vector<float> params(NumParameters(c));
  InitLlamaParams(MakeParamLayout(c, WholeModel(c)), 7, params.data());
  for (float& p : params) p *= 13;  // norm weights too differ from 1
  return params;
}

void RoundTrip(bool tied, int64_t shard_bytes) {
  const GPT2Config c = TinyHfLlama(tied);
  const std::vector<float> params = RandomParams(c);
  const std::string dir = HfLlamaTemp(absl::StrCat("hf_llama_", tied, "_", shard_bytes));
  std::filesystem::remove_all(dir);
  absl::StatusOr<std::vector<std::string>> written = WriteHfModel(
      dir, LlamaHfConfig(c, "float32"), LlamaToHf(c, params.data()), "F32", shard_bytes);
  ASSERT_TRUE(written.ok()) << written.status();
  absl::StatusOr<HfModelFiles> files = HfModelFiles::Open(dir);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->config()["architectures"][0], "LlamaForCausalLM");
  absl::StatusOr<GPT2Config> back = LlamaConfigFromHf(files->config(), files->config_path());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, c);
  const std::vector<std::string> names = files->names();
  EXPECT_EQ(std::count(names.begin(), names.end(), "lm_head.weight"), tied ? 0 : 1);
  absl::StatusOr<HfTensorValues> k = files->Read("model.layers.1.self_attn.k_proj.weight");
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(k->shape, (std::vector<int64_t>{8, 16}));  // 2 key/value heads of 4
  absl::StatusOr<HfTensorValues> emb = files->Read("model.embed_tokens.weight");
  ASSERT_TRUE(emb.ok());
  EXPECT_EQ(emb->shape, (std::vector<int64_t>{11, 16}));  // without the padded rows
  absl::StatusOr<std::vector<float>> imported =
      LlamaFromHf(*back, names, [&](const std::string& name) { return files->Read(name); });
  ASSERT_TRUE(imported.ok()) << imported.status();
  ASSERT_EQ(imported->size(), params.size());
  EXPECT_EQ(0, std::memcmp(imported->data(), params.data(), params.size() * sizeof(float)));
}

TEST(HfLlamaTest, UntiedRoundTripIsBitExact) { RoundTrip(false, 0); }
TEST(HfLlamaTest, TiedRoundTripThroughShardsIsBitExact) { RoundTrip(true, 4000); }

TEST(HfLlamaTest, TheQkvAndGateUpSplitsAreTheFusedRows) {
  const GPT2Config c = TinyHfLlama(false);
  const std::vector<float> params = RandomParams(c);
  const ParamLayout layout = MakeParamLayout(c, WholeModel(c));
  for (const SafetensorsTensor& t : LlamaToHf(c, params.data())) {
    const int64_t qkv =
        layout.slot(ParamTensor::kQkvW).offset + ParamElements(c, ParamTensor::kQkvW);
    const int64_t fc = layout.slot(ParamTensor::kFcW).offset + ParamElements(c, ParamTensor::kFcW);
    if (t.name == "model.layers.1.self_attn.v_proj.weight") {
      EXPECT_EQ(t.values[0], params[qkv + (16 + 8) * 16]);  // layer 1, row C + kv
    }
    if (t.name == "model.layers.1.mlp.up_proj.weight") {
      EXPECT_EQ(t.values[0], params[fc + 24 * 16]);  // layer 1, row F
    }
  }
}

TEST(HfLlamaTest, WhatOurLlamaCannotComputeIsRefusedNamingTheKey) {
  nlohmann::ordered_json json = LlamaHfConfig(TinyHfLlama(true), "float32");
  json["hidden_act"] = "gelu";
  EXPECT_THAT(std::string(LlamaConfigFromHf(json, "c.json").status().message()),
              HasSubstr("c.json: hidden_act = gelu"));
  json = LlamaHfConfig(TinyHfLlama(true), "float32");
  json["rope_scaling"] = {{"rope_type", "llama3"}};
  EXPECT_THAT(std::string(LlamaConfigFromHf(json, "c.json").status().message()),
              HasSubstr("rope_scaling"));
  json = LlamaHfConfig(TinyHfLlama(true), "float32");
  json["attention_bias"] = true;
  EXPECT_THAT(std::string(LlamaConfigFromHf(json, "c.json").status().message()),
              HasSubstr("attention_bias = true"));
  json = LlamaHfConfig(TinyHfLlama(true), "float32");
  json["num_key_value_heads"] = 3;
  EXPECT_THAT(std::string(LlamaConfigFromHf(json, "c.json").status().message()),
              HasSubstr("model.n_kv_head (3)"));
}

TEST(HfLlamaTest, MissingUnknownAndMisshapenTensorsAreRefusedByName) {
  const GPT2Config c = TinyHfLlama(true);
  const std::vector<float> params = RandomParams(c);
  std::map<std::string, HfTensorValues> tensors;
  for (const SafetensorsTensor& t : LlamaToHf(c, params.data())) {
    tensors[t.name] = {t.shape, t.values};
  }
  auto import = [&]() {
    std::vector<std::string> names;
    for (const auto& [name, t] : tensors) names.push_back(name);
    return LlamaFromHf(c, names, [&](const std::string& name) { return tensors.at(name); });
  };
  ASSERT_TRUE(import().ok());
  tensors["model.layers.0.mlp.gate_proj.weight"].shape = {16, 24};
  EXPECT_THAT(std::string(import().status().message()),
              HasSubstr("tensor \"model.layers.0.mlp.gate_proj.weight\" has shape [16, 24]"));
  tensors.erase("model.layers.0.mlp.gate_proj.weight");
  EXPECT_THAT(std::string(import().status().message()),
              HasSubstr("tensor \"model.layers.0.mlp.gate_proj.weight\" [24, 16] is missing"));
  tensors["model.layers.7.mlp.gate_proj.weight"] = {};
  EXPECT_THAT(std::string(import().status().message()),
              HasSubstr("model.layers.7.mlp.gate_proj.weight: not part of a Llama of 2 layers"));
}

}  // namespace
}  // namespace freeride
