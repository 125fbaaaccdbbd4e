// A study's measured blocks, saved round by round so that a stopped study can go on: each rank
// appends the blocks of every round it completes to run.dir/study_blocks_rankNNN.jsonl (its
// own, not yet summed over ranks), and `freeride study --resume` reads them back and measures
// only the rounds still missing. A round counts once its closing line is there: a study killed
// while writing one loses that round, never its earlier ones.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/study/study_report.h"

namespace freeride {

std::string StudyBlocksPath(const std::string& dir, int rank);

// Appends round `round`'s blocks (the plain block that opens a part of the study goes with
// its first round) and the line that closes the round.
absl::Status AppendStudyRound(const std::string& path, int round, int block_steps,
                              const std::vector<Arm>& arms, const std::vector<BlockRecord>& blocks);

struct SavedStudy {
  int rounds = 0;  // complete rounds
  int parts = 0;   // runs they were measured in (each opens with a plain block)
  std::vector<BlockRecord> blocks;
  std::vector<size_t> round_ends;  // blocks.size() at the end of each round
};

// The complete rounds saved in `path`. A block of an arm this study does not have, another
// --block_steps, or a line that is not a block is an error naming the file and line: such a
// study is not this one, and --overwrite starts afresh.
absl::StatusOr<SavedStudy> LoadStudyBlocks(const std::string& path, int block_steps,
                                           const std::vector<Arm>& arms, size_t tasks);

}  // namespace freeride
