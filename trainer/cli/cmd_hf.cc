#include "trainer/cli/cmd_hf.h"

#include <iostream>
#include <string>

#include "absl/strings/str_format.h"
#include "core/json_fields.h"
#include "models/checkpoint_verify.h"
#include "models/hf/hf_directory.h"
#include "models/hf/hf_gpt2.h"
#include "models/hf/hf_llama.h"
#include "models/llmc_checkpoint.h"
#include "trainer/cli/cli.h"
#include "trainer/train_state.h"

namespace freeride {
namespace {

int Failed(const absl::Status& status) {
  std::cerr << "error: " << status.message() << "\n";
  return kExitFailure;
}

// --format: only "hf" today; refused otherwise so that another format can come later.
bool FormatIsHf(const ParsedFlags& flags, const std::string& command) {
  if (flags.Get("format") == "hf") return true;
  std::cerr << "error: " << command << " needs --format hf (the one format it knows), found '"
            << flags.Get("format") << "'\n";
  return false;
}

}  // namespace

std::vector<FlagSpec> ExportFlags() {
  return {{"format", "hf", "hf: a Hugging Face directory (config.json + safetensors)"},
          {"dtype", "fp32|bf16|fp16",
           "how the weights are stored (default fp32; bf16 and fp16 round to nearest even)"},
          {"shard_mb", "MB",
           "largest safetensors file in MB: beyond it, shards with model.safetensors.index.json "
           "(default 5000)"}};
}

int ExportCommand(const ParsedFlags& flags) {
  if (!FormatIsHf(flags, "export")) return kExitUsage;
  if (flags.positional().size() != 2) {
    std::cerr << "error: export takes CHECKPOINT (a checkpoint.dir, a checkpoint or an llm.c "
                 "model file) and OUT_DIR\n";
    return kExitUsage;
  }
  const std::string dtype_flag = flags.Get("dtype", "fp32");
  const std::map<std::string, std::pair<std::string, std::string>> dtypes = {
      {"fp32", {"F32", "float32"}}, {"bf16", {"BF16", "bfloat16"}}, {"fp16", {"F16", "float16"}}};
  auto dtype = dtypes.find(dtype_flag);
  if (dtype == dtypes.end()) {
    std::cerr << "error: --dtype takes fp32, bf16 or fp16, found '" << dtype_flag << "'\n";
    return kExitUsage;
  }
  absl::StatusOr<int64_t> shard_mb = PositiveIntFlag(flags, "shard_mb", 5000);
  if (!shard_mb.ok()) {
    std::cerr << "error: " << shard_mb.status().message() << "\n";
    return kExitUsage;
  }
  const std::string& checkpoint = flags.positional()[0];
  const std::string& out = flags.positional()[1];
  absl::StatusOr<std::string> file = ModelFileOf(checkpoint);
  if (!file.ok()) return Failed(file.status());
  if (absl::Status s = VerifyModelFile(*file); !s.ok()) return Failed(s);
  absl::StatusOr<LlmcModel> model = ReadLlmcModel(*file);
  if (!model.ok()) return Failed(model.status());
  const GPT2Config& config = model->config;
  absl::StatusOr<std::vector<std::string>> written =
      config.is_llama() ? WriteHfModel(out, LlamaHfConfig(config, dtype->second.second),
                                       LlamaToHf(config, model->params.data()), dtype->second.first,
                                       *shard_mb * 1000 * 1000)
                        : WriteHfModel(out, Gpt2HfConfig(config, dtype->second.second),
                                       Gpt2ToHf(config, model->params.data()), dtype->second.first,
                                       *shard_mb * 1000 * 1000);
  if (!written.ok()) return Failed(written.status());
  for (const std::string& path : *written) std::cout << "export: wrote " << path << "\n";
  return kExitOk;
}

std::vector<FlagSpec> ImportFlags() {
  return {{"format", "hf", "hf: a Hugging Face directory (config.json + safetensors)"},
          {"out", "FILE",
           "the llm.c model file to write (fp32): for model.init_from, sample and eval"}};
}

int ImportCommand(const ParsedFlags& flags) {
  if (!FormatIsHf(flags, "import")) return kExitUsage;
  if (flags.positional().size() != 1 || !flags.Has("out")) {
    std::cerr << "error: import takes DIR (config.json with model.safetensors, or shards and "
                 "model.safetensors.index.json) and --out FILE\n";
    return kExitUsage;
  }
  absl::StatusOr<HfModelFiles> files = HfModelFiles::Open(flags.positional()[0]);
  if (!files.ok()) return Failed(files.status());
  const std::string type = JsonStringOr(files->config(), "model_type", "");
  if (type != kGpt2ModelType && type != kLlamaModelType) {
    return Failed(absl::InvalidArgumentError(absl::StrFormat(
        "%s: model_type \"%s\": this build imports \"%s\" (GPT2LMHeadModel) and \"%s\" "
        "(LlamaForCausalLM)",
        files->config_path(), type, kGpt2ModelType, kLlamaModelType)));
  }
  const bool llama = type == kLlamaModelType;
  absl::StatusOr<GPT2Config> config = llama
                                          ? LlamaConfigFromHf(files->config(), files->config_path())
                                          : Gpt2ConfigFromHf(files->config(), files->config_path());
  if (!config.ok()) return Failed(config.status());
  auto read = [&](const std::string& name) { return files->Read(name); };
  absl::StatusOr<std::vector<float>> params = llama ? LlamaFromHf(*config, files->names(), read)
                                                    : Gpt2FromHf(*config, files->names(), read);
  if (!params.ok()) {
    return Failed(absl::InvalidArgumentError(
        absl::StrFormat("%s: %s", flags.positional()[0], params.status().message())));
  }
  if (absl::Status s = WriteLlmcModel(flags.Get("out"), *config, params->data()); !s.ok()) {
    return Failed(s);
  }
  std::cout << absl::StrFormat(
      "import: wrote %s (%s: %d layers, %d heads, n_embd %d, %d positions, vocabulary %d)\n",
      flags.Get("out"), llama ? "Llama" : "GPT-2", config->n_layer, config->n_head, config->n_embd,
      config->max_seq_len, config->vocab_size);
  return kExitOk;
}

}  // namespace freeride
