// The Hugging Face exchange: safetensors headers that lie are refused by tensor, GPT-2 round
// trips through HF tensors bit-exact in fp32 (one file or shards), bf16 and fp16 round as torch
// does, and a model made by PyTorch in HF's layout (tests/golden/make_hf_gpt2_golden.py)
// imports to the same logits.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/hf/hf_directory.h"
#include "models/hf/hf_gpt2.h"
#include "models/hf/safetensors.h"
#include "models/kv_decoder.h"
#include "models/stage_message.h"

namespace freeride {
namespace {

using ::testing::HasSubstr;

constexpr char kGolden[] = "tests/data/hf_gpt2_golden";

std::string HfTemp(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) / name).string();
}

// A safetensors file whose header is `header` (as written) over `buffer_bytes` zero bytes.
std::string FileWith(const std::string& header, int64_t buffer_bytes) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + std::string(buffer_bytes, '\0');
}

std::string RefusalOf(const std::string& file) {
  absl::StatusOr<SafetensorsHeader> h = ParseSafetensors(file, "m.safetensors");
  EXPECT_FALSE(h.ok());
  return h.ok() ? "" : std::string(h.status().message());
}

TEST(SafetensorsTest, AHeaderThatLiesIsRefusedNamingTheTensor) {
  const std::string ok = R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                         R"( "b": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [8, 16]}})";
  ASSERT_TRUE(ParseSafetensors(FileWith(ok, 16), "m").ok());
  EXPECT_THAT(
      RefusalOf(FileWith(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 80]}})", 8)),
      HasSubstr("tensor \"a\": data_offsets [0, 80] end past the data buffer of 8 bytes"));
  EXPECT_THAT(RefusalOf(FileWith(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                                 R"( "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                                 8)),
              HasSubstr("tensor \"b\" at bytes [4, 8] overlaps tensor \"a\" at [0, 8]"));
  EXPECT_THAT(
      RefusalOf(FileWith(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8)),
      HasSubstr("tensor \"a\": shape [3] of F32 is 12 bytes, but data_offsets [0, 8] hold 8"));
  EXPECT_THAT(
      RefusalOf(FileWith(R"({"a": {"dtype": "F33", "shape": [2], "data_offsets": [0, 8]}})", 8)),
      HasSubstr("tensor \"a\": unknown dtype \"F33\""));
  EXPECT_THAT(
      RefusalOf(FileWith(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8)),
      HasSubstr("tensor \"a\" starts at byte 4 of the data buffer"));
  EXPECT_THAT(
      RefusalOf(FileWith(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 8)),
      HasSubstr("the tensors cover 4 bytes of a data buffer of 8"));
  EXPECT_THAT(
      RefusalOf(FileWith(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4)),
      HasSubstr("tensor \"a\""));
  EXPECT_THAT(
      RefusalOf(FileWith(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 8)),
      HasSubstr("tensor \"a\": data_offsets [8, 4] are not [begin, end]"));
  // A shape whose product overflows is refused before it wraps.
  EXPECT_THAT(RefusalOf(FileWith(R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296, 16],)"
                                 R"( "data_offsets": [0, 0]}})",
                                 0)),
              HasSubstr("tensor \"a\": shape [4294967296, 4294967296, 16] holds more elements"));
  // The header length runs past the file.
  std::string lying = FileWith(ok, 16);
  lying[0] = static_cast<char>(0xff);
  lying[3] = static_cast<char>(0x7f);
  EXPECT_THAT(RefusalOf(lying), HasSubstr("header length 2130706687 runs past the file's"));
  EXPECT_THAT(RefusalOf("1234"), HasSubstr("too short for the 8-byte header length"));
  EXPECT_THAT(RefusalOf(FileWith("[1, 2]", 0)), HasSubstr("the header"));
  EXPECT_THAT(RefusalOf(FileWith(R"({"__metadata__": {"format": 1}})", 0)),
              HasSubstr("__metadata__ \"format\" must be a string"));
  // A dtype this build cannot widen is read as an error naming it, not as garbage.
  const std::string ints =
      FileWith(R"({"i": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", 8);
  absl::StatusOr<SafetensorsHeader> h = ParseSafetensors(ints, "m");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_THAT(SafetensorsFloats(ints, *h, h->tensors[0], "m").status().message(),
              HasSubstr("tensor \"i\" is I64; this build reads F32, BF16 and F16"));
}

TEST(SafetensorsTest, HalfConversionRoundsToNearestEven) {
  EXPECT_EQ(HalfBits(1.0f), 0x3c00);
  EXPECT_EQ(HalfBits(-2.0f), 0xc000);
  EXPECT_EQ(HalfBits(65504.0f), 0x7bff);
  EXPECT_EQ(HalfBits(65520.0f), 0x7c00);               // halfway past the largest: to infinity
  EXPECT_EQ(HalfBits(std::ldexp(1.0f, -24)), 0x0001);  // the smallest subnormal
  EXPECT_EQ(HalfBits(std::ldexp(1.0f, -25)), 0x0000);  // halfway to it: ties to even (0)
  EXPECT_EQ(HalfBits(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(HalfBits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie: to even
  EXPECT_EQ(HalfBits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(HalfBits(INFINITY), 0x7c00);
  EXPECT_TRUE(std::isnan(FloatOfHalf(HalfBits(NAN))));
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    if ((bits & 0x7c00) == 0x7c00 && (bits & 0x3ff) != 0) continue;  // NaNs
    ASSERT_EQ(HalfBits(FloatOfHalf(bits)), bits) << b;
  }
}

GPT2Config TinyConfig() { return *MakeGPT2Config(2, 2, 32, 16, 100); }

std::vector<float> RandomParams(const GPT2Config& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  std::vector<float> p(NumParameters(c));
  for (float& v : p) v = normal(rng);
  // llm.c's padded embedding rows are never exported: zero, as an import writes them.
  const ParamLayout layout = MakeParamLayout(c, WholeModel(c));
  float* wte = p.data() + layout.slot(ParamTensor::kWte).offset;
  std::fill(wte + c.vocab_size * c.n_embd, wte + c.padded_vocab_size * c.n_embd, 0.0f);
  return p;
}

absl::StatusOr<std::vector<float>> Import(const std::string& dir, GPT2Config* config) {
  absl::StatusOr<HfModelFiles> files = HfModelFiles::Open(dir);
  if (!files.ok()) return files.status();
  absl::StatusOr<GPT2Config> c = Gpt2ConfigFromHf(files->config(), files->config_path());
  if (!c.ok()) return c.status();
  *config = *c;
  return Gpt2FromHf(*c, files->names(), [&](const std::string& n) { return files->Read(n); });
}

TEST(HfGpt2Test, RoundTripIsBitExactInOneFileAndInShards) {
  const GPT2Config c = TinyConfig();
  const std::vector<float> params = RandomParams(c, 7);
  for (const int64_t shard_bytes : {int64_t{0}, int64_t{20000}}) {
    const std::string dir = HfTemp(absl::StrCat("hf_round_", shard_bytes));
    std::filesystem::remove_all(dir);
    absl::StatusOr<std::vector<std::string>> written = WriteHfModel(
        dir, Gpt2HfConfig(c, "float32"), Gpt2ToHf(c, params.data()), "F32", shard_bytes);
    ASSERT_TRUE(written.ok()) << written.status();
    if (shard_bytes > 0) {
      EXPECT_TRUE(std::filesystem::exists(dir + "/model.safetensors.index.json"));
      EXPECT_TRUE(std::filesystem::exists(dir + "/model-00001-of-00007.safetensors"));
      EXPECT_FALSE(std::filesystem::exists(dir + "/model.safetensors"));
    } else {
      EXPECT_EQ(written->size(), 2u);  // model.safetensors, config.json
    }
    GPT2Config read;
    absl::StatusOr<std::vector<float>> back = Import(dir, &read);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(read, c);
    ASSERT_EQ(back->size(), params.size());
    EXPECT_EQ(std::memcmp(back->data(), params.data(), params.size() * sizeof(float)), 0);
  }
}

TEST(HfGpt2Test, BlockMatricesAreStoredAsConv1DTransposes) {
  const GPT2Config c = TinyConfig();
  const std::vector<float> params = RandomParams(c, 8);
  const std::vector<SafetensorsTensor> hf = Gpt2ToHf(c, params.data());
  const ParamLayout layout = MakeParamLayout(c, WholeModel(c));
  auto find = [&](const std::string& name) -> const SafetensorsTensor& {
    for (const SafetensorsTensor& t : hf) {
      if (t.name == name) return t;
    }
    ADD_FAILURE() << "no " << name;
    return hf[0];
  };
  const int64_t C = c.n_embd;
  // llm.c's layer 1 qkvw[o][i] is HF's c_attn.weight[i][o], [C, 3C].
  const SafetensorsTensor& attn = find("transformer.h.1.attn.c_attn.weight");
  EXPECT_EQ(attn.shape, (std::vector<int64_t>{C, 3 * C}));
  const float* qkvw = params.data() + layout.slot(ParamTensor::kQkvW).offset + 3 * C * C;
  EXPECT_EQ(attn.values[5 * 3 * C + 70], qkvw[70 * C + 5]);
  const SafetensorsTensor& proj = find("transformer.h.0.mlp.c_proj.weight");
  EXPECT_EQ(proj.shape, (std::vector<int64_t>{4 * C, C}));
  const float* fcprojw = params.data() + layout.slot(ParamTensor::kFcProjW).offset;
  EXPECT_EQ(proj.values[100 * C + 3], fcprojw[3 * 4 * C + 100]);
  EXPECT_EQ(find("transformer.wte.weight").shape, (std::vector<int64_t>{100, C}));
  for (const SafetensorsTensor& t : hf) EXPECT_NE(t.name, "lm_head.weight");
}

// Reads tests/data/hf_gpt2_golden/tokens.txt and logits.bin.
void ReadGoldenLogits(std::vector<int32_t>* tokens, std::vector<float>* logits) {
  std::ifstream in(absl::StrCat(kGolden, "/tokens.txt"));
  for (int32_t t; in >> t;) tokens->push_back(t);
  absl::StatusOr<std::string> bytes = ReadFile(absl::StrCat(kGolden, "/logits.bin"));
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  logits->resize(bytes->size() / sizeof(float));
  std::memcpy(logits->data(), bytes->data(), bytes->size());
}

TEST(HfGpt2Test, PyTorchsModelImportsToItsLogits) {
  GPT2Config c;
  absl::StatusOr<std::vector<float>> params = Import(kGolden, &c);
  ASSERT_TRUE(params.ok()) << params.status();
  std::vector<int32_t> tokens;
  std::vector<float> golden;
  ReadGoldenLogits(&tokens, &golden);
  ASSERT_EQ(static_cast<int64_t>(tokens.size()), c.max_seq_len);
  ASSERT_EQ(static_cast<int64_t>(golden.size()), c.max_seq_len * c.vocab_size);
  auto decoder = MakeKvDecoder<float>(c, params->data(), 1, c.max_seq_len);
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  double worst = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const float* logits = *(*decoder)->Step(&tokens[t]);
    for (int64_t v = 0; v < c.vocab_size; ++v) {
      worst = std::max(worst, std::abs(double{logits[v]} - golden[t * c.vocab_size + v]));
    }
  }
  EXPECT_LT(worst, 1e-4) << "largest logit difference from PyTorch's";

  // And back out: every tensor as PyTorch wrote it, bit for bit.
  const std::string dir = HfTemp("hf_golden_again");
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(
      WriteHfModel(dir, Gpt2HfConfig(c, "float32"), Gpt2ToHf(c, params->data()), "F32", 0).ok());
  absl::StatusOr<HfModelFiles> ours = HfModelFiles::Open(dir);
  absl::StatusOr<HfModelFiles> theirs = HfModelFiles::Open(kGolden);
  ASSERT_TRUE(ours.ok() && theirs.ok());
  ASSERT_EQ(ours->names(), theirs->names());
  for (const std::string& name : theirs->names()) {
    absl::StatusOr<HfTensorValues> a = ours->Read(name), b = theirs->Read(name);
    ASSERT_TRUE(a.ok() && b.ok()) << name;
    EXPECT_EQ(a->shape, b->shape) << name;
    EXPECT_EQ(std::memcmp(a->values.data(), b->values.data(), a->values.size() * sizeof(float)), 0)
        << name;
  }
}

TEST(HfGpt2Test, Bf16AndFp16ExportRoundAsTorchDoes) {
  GPT2Config c;
  absl::StatusOr<std::vector<float>> params = Import(kGolden, &c);
  ASSERT_TRUE(params.ok()) << params.status();
  for (const auto& [dtype, sub] :
       {std::pair<std::string, std::string>{"BF16", "bf16"}, {"F16", "fp16"}}) {
    const std::string dir = HfTemp("hf_golden_" + sub);
    std::filesystem::remove_all(dir);
    ASSERT_TRUE(
        WriteHfModel(dir, Gpt2HfConfig(c, sub), Gpt2ToHf(c, params->data()), dtype, 0).ok());
    absl::StatusOr<std::string> ours = ReadFile(dir + "/model.safetensors");
    absl::StatusOr<std::string> torch =
        ReadFile(absl::StrCat(kGolden, "/", sub, "/model.safetensors"));
    ASSERT_TRUE(ours.ok() && torch.ok());
    absl::StatusOr<SafetensorsHeader> a = ParseSafetensors(*ours, "ours");
    absl::StatusOr<SafetensorsHeader> b = ParseSafetensors(*torch, "torch");
    ASSERT_TRUE(a.ok() && b.ok());
    // Both files list the same tensors in the same order: their buffers must be equal bytes.
    EXPECT_EQ(ours->substr(a->data_start), torch->substr(b->data_start)) << dtype;
    GPT2Config read;
    absl::StatusOr<std::vector<float>> back = Import(absl::StrCat(kGolden, "/", sub), &read);
    ASSERT_TRUE(back.ok()) << back.status();
    for (size_t i = 0; i < back->size(); i += 97) {
      const float want = dtype == "BF16" ? FloatOfBf16(Bf16Bits((*params)[i]))
                                         : FloatOfHalf(HalfBits((*params)[i]));
      ASSERT_EQ((*back)[i], want) << dtype << " parameter " << i;
    }
  }
}

TEST(HfGpt2Test, ConfigAndTensorMismatchesAreNamed) {
  const GPT2Config c = TinyConfig();
  nlohmann::json config = Gpt2HfConfig(c, "float32");
  absl::StatusOr<GPT2Config> read = Gpt2ConfigFromHf(config, "config.json");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, c);
  config["activation_function"] = "relu";
  EXPECT_THAT(Gpt2ConfigFromHf(config, "config.json").status().message(),
              HasSubstr("config.json: activation_function = relu"));
  config["activation_function"] = "gelu_new";
  config["n_inner"] = 100;
  EXPECT_THAT(Gpt2ConfigFromHf(config, "config.json").status().message(),
              HasSubstr("n_inner = 100"));
  config.erase("n_inner");
  config.erase("n_head");
  EXPECT_THAT(Gpt2ConfigFromHf(config, "config.json").status().message(), HasSubstr("n_head"));

  const std::vector<float> params = RandomParams(c, 9);
  std::vector<SafetensorsTensor> tensors = Gpt2ToHf(c, params.data());
  std::map<std::string, HfTensorValues> by_name;
  for (const SafetensorsTensor& t : tensors) by_name[t.name] = {t.shape, t.values};
  auto import = [&](const std::map<std::string, HfTensorValues>& m) {
    std::vector<std::string> names;
    for (const auto& [n, v] : m) names.push_back(n);
    return Gpt2FromHf(
        c, names, [&](const std::string& n) -> absl::StatusOr<HfTensorValues> { return m.at(n); });
  };
  ASSERT_TRUE(import(by_name).ok());
  // GPT2Model's names (no prefix), the old attention masks, and a tied lm_head are taken.
  std::map<std::string, HfTensorValues> bare;
  for (const auto& [n, v] : by_name) bare[n.substr(std::strlen("transformer."))] = v;
  bare["h.0.attn.bias"] = {{1, 1, 16, 16}, std::vector<float>(256, 1.0f)};
  bare["lm_head.weight"] = by_name["transformer.wte.weight"];
  absl::StatusOr<std::vector<float>> from_bare = import(bare);
  ASSERT_TRUE(from_bare.ok()) << from_bare.status();
  EXPECT_EQ(*from_bare, params);
  bare["lm_head.weight"].values[3] += 1.0f;
  EXPECT_THAT(import(bare).status().message(), HasSubstr("\"lm_head.weight\" differs"));

  auto wrong = by_name;
  wrong["transformer.h.1.mlp.c_fc.weight"].shape = {128, 32};
  EXPECT_THAT(import(wrong).status().message(),
              HasSubstr("tensor \"transformer.h.1.mlp.c_fc.weight\" has shape [128, 32]; "
                        "config.json's model needs [32, 128]"));
  auto missing = by_name;
  missing.erase("transformer.ln_f.bias");
  EXPECT_THAT(import(missing).status().message(),
              HasSubstr("tensor \"transformer.ln_f.bias\" [32] is missing"));
  auto extra = by_name;
  extra["transformer.h.2.ln_1.weight"] = {{32}, std::vector<float>(32)};
  EXPECT_THAT(import(extra).status().message(),
              HasSubstr("transformer.h.2.ln_1.weight: not part of a GPT-2 of 2 layers"));
}

TEST(HfDirectoryTest, AnIndexThatDisagreesWithItsShardsIsRefused) {
  const GPT2Config c = TinyConfig();
  const std::vector<float> params = RandomParams(c, 10);
  const std::string dir = HfTemp("hf_index");
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(
      WriteHfModel(dir, Gpt2HfConfig(c, "float32"), Gpt2ToHf(c, params.data()), "F32", 20000).ok());
  const std::string index_path = dir + "/model.safetensors.index.json";
  const std::string index = *ReadFile(index_path);
  nlohmann::json json = nlohmann::json::parse(index);
  json["weight_map"]["transformer.wpe.weight"] = "model-00002-of-00007.safetensors";
  ASSERT_TRUE(WriteFileAtomically(index_path, json.dump()).ok());
  EXPECT_THAT(HfModelFiles::Open(dir).status().message(),
              HasSubstr("tensor \"transformer.wpe.weight\" is in " + dir +
                        "/model-00001-of-00007.safetensors, but " + index_path +
                        " puts it in model-00002-of-00007.safetensors"));
  json = nlohmann::json::parse(index);
  json["weight_map"]["transformer.wpe.weight"] = "../elsewhere.safetensors";
  ASSERT_TRUE(WriteFileAtomically(index_path, json.dump()).ok());
  EXPECT_THAT(HfModelFiles::Open(dir).status().message(),
              HasSubstr("weight_map \"transformer.wpe.weight\" must name a file in"));
  json = nlohmann::json::parse(index);
  json["weight_map"]["transformer.h.9.ln_1.weight"] = "model-00001-of-00007.safetensors";
  ASSERT_TRUE(WriteFileAtomically(index_path, json.dump()).ok());
  EXPECT_THAT(HfModelFiles::Open(dir).status().message(),
              HasSubstr("puts tensor \"transformer.h.9.ln_1.weight\" in "
                        "model-00001-of-00007.safetensors, which does not hold it"));
}

}  // namespace
}  // namespace freeride
