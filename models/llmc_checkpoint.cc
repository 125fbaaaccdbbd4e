#include "models/llmc_checkpoint.h"

#include <cstdint>
#include <cstring>
#include <fstream>

#include "absl/strings/str_format.h"
#include "core/files.h"

namespace freeride {
namespace {

constexpr int kHeaderInts = 256;
// Where the header goes on past llm.c's fields (zero in its GPT-2 files): the model family,
// then Llama's n_kv_head, ffn_hidden, tie_embeddings, rope_theta and norm_eps (doubles).
constexpr int kArchInt = 8;

absl::StatusOr<GPT2Config> ParseHeader(const int32_t* h, const std::string& path) {
  if (h[0] != kLlmcModelMagic) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: not an llm.c model checkpoint: magic %d, expected %d", path, h[0], kLlmcModelMagic));
  }
  if (h[1] != kLlmcModelVersionFp32 && h[1] != kLlmcModelVersionBf16) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: llm.c model version %d is not supported (3 = fp32 and 5 = bf16 are)", path, h[1]));
  }
  GPT2Config c;
  c.max_seq_len = h[2];
  c.vocab_size = h[3];
  c.n_layer = h[4];
  c.n_head = h[5];
  c.n_embd = h[6];
  c.padded_vocab_size = h[7] != 0 ? h[7] : PadVocab(h[3]);
  if (h[kArchInt] == static_cast<int32_t>(ModelArch::kLlama)) {
    c.arch = ModelArch::kLlama;
    c.n_kv_head = h[kArchInt + 1];
    c.ffn_hidden = h[kArchInt + 2];
    c.tie_embeddings = h[kArchInt + 3] != 0;
    std::memcpy(&c.rope_theta, &h[kArchInt + 4], sizeof(double));
    std::memcpy(&c.norm_eps, &h[kArchInt + 6], sizeof(double));
  } else if (h[kArchInt] != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: bad header: model family %d (0 = gpt2, 1 = llama)", path, h[kArchInt]));
  }
  if (absl::Status s = ValidateGPT2Config(c); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: bad header: %s", path, s.message()));
  }
  return c;
}

float Bf16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Calls fn(offset in whole, offset in stage, elements) for every tensor piece a stage holds.
template <typename Fn>
void ForEachStagePiece(const GPT2Config& config, const StageSpec& stage, Fn fn) {
  const ParamLayout whole = MakeParamLayout(config, WholeModel(config));
  const ParamLayout part = MakeParamLayout(config, stage);
  for (int i = 0; i < kNumParamTensors; ++i) {
    const ParamTensor t = static_cast<ParamTensor>(i);
    if (!part.slots[i].present) continue;
    int64_t from = whole.slots[i].offset;
    if (IsPerLayer(t)) from += stage.first_layer * ParamElements(config, t);
    fn(from, part.slots[i].offset, part.slots[i].elements);
  }
}

}  // namespace

absl::StatusOr<GPT2Config> ReadLlmcModelConfig(const std::string& path) {
  if (absl::Status s = CheckRegularFile(path); !s.ok()) return s;
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrFormat("%s: cannot open model checkpoint", path));
  int32_t header[kHeaderInts];
  if (!in.read(reinterpret_cast<char*>(header), sizeof(header))) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: truncated: shorter than the 1024-byte llm.c header", path));
  }
  return ParseHeader(header, path);
}

absl::StatusOr<LlmcModel> ReadLlmcModel(const std::string& path) {
  if (absl::Status s = CheckRegularFile(path); !s.ok()) return s;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return absl::NotFoundError(absl::StrFormat("%s: cannot open model checkpoint", path));
  const int64_t size = in.tellg();
  in.seekg(0);
  int32_t header[kHeaderInts];
  if (size < static_cast<int64_t>(sizeof(header)) ||
      !in.read(reinterpret_cast<char*>(header), sizeof(header))) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: truncated: shorter than the 1024-byte llm.c header", path));
  }
  absl::StatusOr<GPT2Config> config = ParseHeader(header, path);
  if (!config.ok()) return config.status();
  LlmcModel model{*config, {}};
  const int64_t n = NumParameters(*config);
  const int64_t bytes_per = header[1] == kLlmcModelVersionFp32 ? 4 : 2;
  const int64_t expected = static_cast<int64_t>(sizeof(header)) + n * bytes_per;
  if (size != expected) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d bytes, but a version-%d checkpoint of this shape (%d parameters) has %d%s", path,
        size, header[1], n, expected, size < expected ? " (truncated)" : ""));
  }
  model.params.resize(n);
  if (bytes_per == 4) {
    in.read(reinterpret_cast<char*>(model.params.data()), n * 4);
  } else {
    std::vector<uint16_t> raw(n);
    in.read(reinterpret_cast<char*>(raw.data()), n * 2);
    for (int64_t i = 0; i < n; ++i) model.params[i] = Bf16ToFloat(raw[i]);
  }
  if (!in) return absl::DataLossError(absl::StrFormat("%s: read failed", path));
  return model;
}

absl::Status WriteLlmcModel(const std::string& path, const GPT2Config& c, const float* params) {
  int32_t header[kHeaderInts] = {};
  header[0] = kLlmcModelMagic;
  header[1] = kLlmcModelVersionFp32;
  header[2] = static_cast<int32_t>(c.max_seq_len);
  header[3] = static_cast<int32_t>(c.vocab_size);
  header[4] = static_cast<int32_t>(c.n_layer);
  header[5] = static_cast<int32_t>(c.n_head);
  header[6] = static_cast<int32_t>(c.n_embd);
  header[7] = static_cast<int32_t>(c.padded_vocab_size);
  if (c.is_llama()) {
    header[kArchInt] = static_cast<int32_t>(ModelArch::kLlama);
    header[kArchInt + 1] = static_cast<int32_t>(c.n_kv_head);
    header[kArchInt + 2] = static_cast<int32_t>(c.ffn_hidden);
    header[kArchInt + 3] = c.tie_embeddings ? 1 : 0;
    std::memcpy(&header[kArchInt + 4], &c.rope_theta, sizeof(double));
    std::memcpy(&header[kArchInt + 6], &c.norm_eps, sizeof(double));
  }
  const int64_t n = NumParameters(c);
  std::string bytes(sizeof(header) + n * sizeof(float), '\0');
  std::memcpy(bytes.data(), header, sizeof(header));
  std::memcpy(bytes.data() + sizeof(header), params, n * sizeof(float));
  return WriteFileAtomically(path, bytes);
}

void CopyStageFromWhole(const GPT2Config& config, const StageSpec& stage, const float* whole,
                        float* stage_params) {
  ForEachStagePiece(config, stage, [&](int64_t from, int64_t to, int64_t n) {
    std::memcpy(stage_params + to, whole + from, n * sizeof(float));
  });
}

void CopyStageToWhole(const GPT2Config& config, const StageSpec& stage, const float* stage_params,
                      float* whole) {
  ForEachStagePiece(config, stage, [&](int64_t from, int64_t to, int64_t n) {
    std::memcpy(whole + from, stage_params + to, n * sizeof(float));
  });
}

}  // namespace freeride
