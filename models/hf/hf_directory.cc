#include "models/hf/hf_directory.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/files.h"
#include "core/json_fields.h"

namespace freeride {
namespace {

namespace fs = std::filesystem;

int64_t TensorBytes(const SafetensorsTensor& t, int element_bytes) {
  return static_cast<int64_t>(t.values.size()) * element_bytes;
}

absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseJsonObject(*text, path);
}

}  // namespace

absl::StatusOr<std::vector<std::string>> WriteHfModel(const std::string& dir,
                                                      const nlohmann::ordered_json& config,
                                                      const std::vector<SafetensorsTensor>& tensors,
                                                      const std::string& dtype,
                                                      int64_t shard_bytes) {
  const int element_bytes = SafetensorsDtypeBytes(dtype);
  int64_t total = 0;
  for (const SafetensorsTensor& t : tensors) total += TensorBytes(t, element_bytes);
  // Shards in order: a new one starts where the next tensor would pass shard_bytes.
  std::vector<std::vector<const SafetensorsTensor*>> shards(1);
  int64_t in_shard = 0;
  for (const SafetensorsTensor& t : tensors) {
    const int64_t bytes = TensorBytes(t, element_bytes);
    if (shard_bytes > 0 && total > shard_bytes && !shards.back().empty() &&
        in_shard + bytes > shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&t);
    in_shard += bytes;
  }
  if (absl::Status s = MakeDirectories(dir); !s.ok()) return s;
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  std::vector<std::string> written;
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = shards.size() == 1 ? std::string(kHfWeightsFile)
                                                : absl::StrFormat("model-%05d-of-%05d.safetensors",
                                                                  i + 1, shards.size());
    absl::StatusOr<std::string> bytes = SerializeSafetensors(shards[i], dtype, metadata);
    if (!bytes.ok()) return bytes.status();
    const std::string path = (fs::path(dir) / name).string();
    if (absl::Status s = WriteFileAtomically(path, *bytes); !s.ok()) return s;
    written.push_back(path);
    for (const SafetensorsTensor* t : shards[i]) weight_map[t->name] = name;
  }
  if (shards.size() > 1) {
    const nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}},
                                          {"weight_map", weight_map}};
    const std::string path = (fs::path(dir) / kHfIndexFile).string();
    if (absl::Status s = WriteFileAtomically(path, index.dump(2) + "\n"); !s.ok()) return s;
    written.push_back(path);
  }
  const std::string path = (fs::path(dir) / kHfConfigFile).string();
  if (absl::Status s = WriteFileAtomically(path, config.dump(2) + "\n"); !s.ok()) return s;
  written.push_back(path);
  return written;
}

absl::StatusOr<HfModelFiles> HfModelFiles::Open(const std::string& dir) {
  HfModelFiles model;
  model.config_path_ = (fs::path(dir) / kHfConfigFile).string();
  absl::StatusOr<nlohmann::json> config = ReadJsonFile(model.config_path_);
  if (!config.ok()) return config.status();
  model.config_ = *std::move(config);
  // The files to read, and for a sharded model where the index says each tensor is.
  std::vector<std::string> names;
  std::map<std::string, std::string> index;
  const std::string index_path = (fs::path(dir) / kHfIndexFile).string();
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    absl::StatusOr<nlohmann::json> json = ReadJsonFile(index_path);
    if (!json.ok()) return json.status();
    absl::StatusOr<const nlohmann::json*> map = JsonFields(*json, index_path).Object("weight_map");
    if (!map.ok()) return map.status();
    for (const auto& [tensor, file] : (*map)->items()) {
      // A shard is a file name inside the directory, never a path out of it.
      if (!file.is_string() || file.get<std::string>().empty() ||
          file.get<std::string>().find('/') != std::string::npos ||
          file.get<std::string>() == "..") {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: weight_map \"%s\" must name a file in %s, found %s", index_path,
                            tensor, dir, DescribeJson(file)));
      }
      const std::string name = file.get<std::string>();
      index[tensor] = name;
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
    if (names.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map names no tensor"));
    }
  } else {
    names.push_back(kHfWeightsFile);
  }
  for (const std::string& name : names) {
    auto file = std::make_unique<File>();
    file->path = (fs::path(dir) / name).string();
    if (absl::Status s = CheckRegularFile(file->path); !s.ok()) return s;
    absl::StatusOr<std::string> bytes = ReadFile(file->path);
    if (!bytes.ok()) return bytes.status();
    file->bytes = *std::move(bytes);
    absl::StatusOr<SafetensorsHeader> header = ParseSafetensors(file->bytes, file->path);
    if (!header.ok()) return header.status();
    file->header = *std::move(header);
    for (const SafetensorsEntry& e : file->header.tensors) {
      auto [it, added] = model.tensors_.emplace(e.name, std::make_pair(file.get(), &e));
      if (!added) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "tensor \"%s\" is in both %s and %s", e.name, it->second.first->path, file->path));
      }
      if (!index.empty()) {
        auto listed = index.find(e.name);
        if (listed == index.end() || listed->second != name) {
          return absl::InvalidArgumentError(
              absl::StrFormat("tensor \"%s\" is in %s, but %s %s", e.name, file->path, index_path,
                              listed == index.end() ? "does not list it"
                                                    : absl::StrCat("puts it in ", listed->second)));
        }
      }
    }
    model.files_.push_back(std::move(file));
  }
  for (const auto& [tensor, file] : index) {
    if (model.tensors_.count(tensor) == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s puts tensor \"%s\" in %s, which does not hold it", index_path, tensor, file));
    }
  }
  return model;
}

std::vector<std::string> HfModelFiles::names() const {
  std::vector<std::string> out;
  for (const auto& [name, where] : tensors_) out.push_back(name);
  return out;
}

absl::StatusOr<HfTensorValues> HfModelFiles::Read(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrFormat("no tensor \"%s\"", name));
  }
  const auto& [file, entry] = it->second;
  absl::StatusOr<std::vector<float>> values =
      SafetensorsFloats(file->bytes, file->header, *entry, file->path);
  if (!values.ok()) return values.status();
  return HfTensorValues{entry->shape, *std::move(values)};
}

}  // namespace freeride
