// An exported Llama loads in the PyTorch golden script with equal logits: the golden model
// (tests/data/llama_golden/init.bin, untied, and the same weights with the head tied) goes out
// through `freeride export --format hf`; the export must be byte for byte the files
// tests/golden/make_llama_golden.py --hf read (their size and CRC-32 are in hf_NAME.json), and
// our logits, by the key/value-cache decoder and by LlamaStage's full forward, equal the logits
// that script computed from them with LlamaForCausalLM's forward (hf_NAME_logits.bin).
#include <zlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/files.h"
#include "gtest/gtest.h"
#include "models/kv_decoder.h"
#include "models/llama.h"
#include "models/llmc_checkpoint.h"
#include "tests/trainer/run_cli.h"
#include "tests/trainer/tiny_run.h"

namespace freeride {
namespace {

constexpr char kGolden[] = "tests/data/llama_golden";

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::vector<float> ReadFloats(const std::string& path) {
  const std::string bytes = ReadBytes(path);
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

// The golden model's config (golden.json), its head tied or not, and its parameters: init.bin
// is untied; tied, the same tensors without the head's matrix (the last slot).
GPT2Config GoldenModel(bool tied, std::vector<float>* params) {
  const nlohmann::json m =
      nlohmann::json::parse(ReadBytes(std::string(kGolden) + "/golden.json"))["model"];
  absl::StatusOr<GPT2Config> cfg =
      MakeLlamaConfig(m["n_layer"], m["n_head"], m["n_kv_head"], m["n_embd"], m["max_seq_len"],
                      m["vocab_size"], m["ffn_hidden"], m["rope_theta"], m["norm_eps"], tied);
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  *params = ReadFloats(std::string(kGolden) + "/init.bin");
  params->resize(static_cast<size_t>(NumParameters(*cfg)));
  return *cfg;
}

void ExpectExportedLogitsEqualPyTorchs(bool tied) {
  const std::string name = tied ? "tied" : "untied";
  std::vector<float> params;
  const GPT2Config cfg = GoldenModel(tied, &params);
  const std::string model = Temp("llama_hf_golden_" + name + ".bin");
  const std::string dir = Temp("llama_hf_golden_" + name);
  ASSERT_TRUE(WriteLlmcModel(model, cfg, params.data()).ok());
  std::filesystem::remove_all(dir);
  const CliResult exported = RunCommand({"export", "--format", "hf", model, dir});
  ASSERT_EQ(exported.status, 0) << exported.err;

  const std::string record = ReadBytes(std::string(kGolden) + "/hf_" + name + ".json");
  ASSERT_FALSE(record.empty()) << "make it with tests/golden/make_llama_golden.py --hf " << dir;
  const nlohmann::json golden = nlohmann::json::parse(record);
  // The very files the script read: config.json's values and each safetensors file's bytes.
  EXPECT_EQ(nlohmann::json::parse(ReadBytes(dir + "/config.json")), golden["config"]);
  ASSERT_FALSE(golden["files"].empty());
  for (const auto& [file, sum] : golden["files"].items()) {
    const std::string bytes = ReadBytes(dir + "/" + file);
    EXPECT_EQ(bytes.size(), sum["bytes"].get<size_t>()) << file;
    const uLong crc = crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data()),
                            static_cast<uInt>(bytes.size()));
    EXPECT_EQ(crc, sum["crc32"].get<uLong>()) << file << ": not what the golden script read";
  }

  const std::vector<int32_t> tokens = golden["tokens"];
  const std::vector<float> theirs =
      ReadFloats(std::string(kGolden) + "/hf_" + name + "_logits.bin");
  const int64_t T = static_cast<int64_t>(tokens.size()), V = cfg.vocab_size;
  const int64_t Vp = cfg.padded_vocab_size;
  ASSERT_EQ(T, cfg.max_seq_len);
  ASSERT_EQ(static_cast<int64_t>(theirs.size()), T * V);

  // Ours twice: position by position through the decoder, and the full forward.
  auto decoder = MakeKvDecoder<float>(cfg, params.data(), 1, T);
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  LlamaStage<float> full(cfg, WholeModel(cfg), 1, T, 1);
  std::copy(params.begin(), params.end(), full.params());
  std::copy(tokens.begin(), tokens.end(), full.tokens(0));
  std::fill(full.targets(0), full.targets(0) + T, 0);
  full.Forward(0);
  double worst = 0, scale = 0;
  for (int64_t t = 0; t < T; ++t) {
    absl::StatusOr<const float*> stepped = (*decoder)->Step(&tokens[t]);
    ASSERT_TRUE(stepped.ok()) << stepped.status();
    for (int64_t v = 0; v < V; ++v) {
      const double want = theirs[t * V + v];
      scale = std::max(scale, std::fabs(want));
      worst = std::max(
          {worst, std::fabs((*stepped)[v] - want), std::fabs(full.logits(0)[t * Vp + v] - want)});
    }
  }
  EXPECT_GT(scale, 0.1) << "logits this small would hide a wrong tensor";
  EXPECT_LT(worst, 1e-5) << "largest logit difference from PyTorch's (" << name << ")";
}

TEST(LlamaHfGoldenTest, AnExportedUntiedModelHasPyTorchsLogits) {
  ExpectExportedLogitsEqualPyTorchs(false);
}

TEST(LlamaHfGoldenTest, AnExportedTiedModelHasPyTorchsLogits) {
  ExpectExportedLogitsEqualPyTorchs(true);
}

}  // namespace
}  // namespace freeride
