// ZeRO-1 checkpoints (parallel.zero = 1): each data-parallel rank's share of its stage's AdamW
// moments in a file of its own, moments_rSSS_dRRR.bin (stage SSS, replica RRR), beside the
// stage's state file, which then holds the parameters only (RankState::moment_shards). A share
// file says which elements it holds (ranges of the stage's parameters, its chunks concatenated
// in chunk order), so that a resume under any dp, pp or zero setting puts the moments back
// together whole and takes its own out of them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/grad_norm.h"
#include "trainer/train_state.h"

namespace freeride {

struct MomentShard {
  int64_t step = 0, stage = 0, replica = 0, shards = 0;
  int64_t stage_params = 0;        // the stage's parameters, all chunks
  std::vector<ParamRange> ranges;  // in the stage's concatenated chunks, the order m, v keep
  std::vector<float> m, v;         // Σ ranges' n each
};

std::string MomentShardFileName(int64_t stage, int64_t replica);

absl::Status WriteMomentShard(const std::string& path, const MomentShard& shard);
// Refuses a file that is not one, is cut short, or holds ranges outside the stage.
absl::StatusOr<MomentShard> ReadMomentShard(const std::string& path);

// Fills `state`'s m and v (the stage's every parameter) from the share files of checkpoint
// `dir` that its moment_shards name, each checked against the manifest's checksum first; an
// error names a file that is missing, corrupt, or from another step or stage, and elements no
// share holds or two do.
absl::Status AssembleStageMoments(const std::string& dir, RankState* state);

}  // namespace freeride
