// A Hugging Face model directory: config.json beside the weights, either one
// model.safetensors or shards model-0000N-of-0000M.safetensors named by
// model.safetensors.index.json ({"metadata": {"total_size": bytes}, "weight_map": {tensor:
// file}}). Writing picks shards when the tensors exceed a size; reading takes either form and
// checks the index against the shards (a tensor in no shard, in two, or in another shard than
// the index says is an error naming it).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/hf/hf_gpt2.h"
#include "models/hf/safetensors.h"

namespace freeride {

inline constexpr char kHfConfigFile[] = "config.json";
inline constexpr char kHfWeightsFile[] = "model.safetensors";
inline constexpr char kHfIndexFile[] = "model.safetensors.index.json";

// Writes `config` and `tensors` (stored as `dtype`: F32, BF16 or F16) into `dir` (created):
// one model.safetensors, or shards of at most `shard_bytes` of tensor data each (a tensor
// larger than that gets a shard of its own) when 0 < shard_bytes < the tensors' bytes.
// Returns the files written.
absl::StatusOr<std::vector<std::string>> WriteHfModel(const std::string& dir,
                                                      const nlohmann::ordered_json& config,
                                                      const std::vector<SafetensorsTensor>& tensors,
                                                      const std::string& dtype,
                                                      int64_t shard_bytes);

// The tensors of a model directory, checked when opened, read by name.
class HfModelFiles {
 public:
  static absl::StatusOr<HfModelFiles> Open(const std::string& dir);

  const nlohmann::json& config() const { return config_; }
  const std::string& config_path() const { return config_path_; }
  // Every tensor's name, sorted.
  std::vector<std::string> names() const;
  absl::StatusOr<HfTensorValues> Read(const std::string& name) const;

 private:
  struct File {
    std::string path;
    std::string bytes;
    SafetensorsHeader header;
  };
  nlohmann::json config_;
  std::string config_path_;
  std::vector<std::unique_ptr<File>> files_;
  std::map<std::string, std::pair<const File*, const SafetensorsEntry*>> tensors_;
};

}  // namespace freeride
