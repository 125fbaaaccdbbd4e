#include "trainer/checkpoint_manifest.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "core/checksum.h"
#include "core/files.h"
#include "trainer/moment_shards.h"

namespace freeride {
namespace {

namespace fs = std::filesystem;

}  // namespace

absl::Status WriteCheckpointManifest(const std::string& dir, const RankState& state,
                                     const std::vector<std::string>& files) {
  const GPT2Config& c = state.model;
  nlohmann::ordered_json json = {
      {"format", "freeride-checkpoint"},
      {"version", kTrainStateVersion},
      {"step", state.step},
      {"pp", state.pp},
      {"dp", state.dp},
      {"chunks", state.chunks},
      {"model",
       {{"n_layer", c.n_layer},
        {"n_head", c.n_head},
        {"n_embd", c.n_embd},
        {"max_seq_len", c.max_seq_len},
        {"vocab_size", c.vocab_size}}}};
  if (c.is_llama()) {
    json["model"]["arch"] = ModelArchName(c.arch);
    json["model"]["n_kv_head"] = c.n_kv_head;
    json["model"]["ffn_hidden"] = c.ffn_hidden;
    json["model"]["rope_theta"] = c.rope_theta;
    json["model"]["norm_eps"] = c.norm_eps;
    json["model"]["tie_embeddings"] = c.tie_embeddings;
  }
  json["files"] = nlohmann::ordered_json::array();
  for (int64_t stage = 0; stage < state.pp; ++stage) {
    json["files"].push_back(RankStateFileName(static_cast<int>(stage)));
  }
  if (state.moment_shards > 0) {
    // ZeRO-1: each stage's moments in one share file per data-parallel rank.
    json["moment_shards"] = state.moment_shards;
    for (int64_t stage = 0; stage < state.pp; ++stage) {
      for (int64_t replica = 0; replica < state.moment_shards; ++replica) {
        json["files"].push_back(MomentShardFileName(stage, replica));
      }
    }
  }
  nlohmann::ordered_json sums = nlohmann::ordered_json::object();
  for (const std::string& file : files) {
    absl::StatusOr<FileChecksum> sum = ChecksumFile((fs::path(dir) / file).string());
    if (!sum.ok()) return sum.status();
    sums[file] = {{"bytes", sum->bytes}, {"crc32c", Crc32cHex(sum->crc32c)}};
  }
  json["checksums"] = sums;
  return WriteFileAtomically((fs::path(dir) / kManifestFileName).string(), json.dump() + "\n");
}

}  // namespace freeride
