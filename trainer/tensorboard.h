// TensorBoard event files (run.tensorboard): every number of metrics.jsonl as a TensorBoard
// scalar, written by the rank that writes metrics.jsonl, in TensorFlow's event format
// (tensorboard_event.proto) framed as TFRecords.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace freeride {

// TFRecord's checksum: the CRC-32C rotated right by 15 bits plus 0xa282ead8 (a CRC of data
// that holds CRCs is weak, so TFRecords store it masked).
uint32_t MaskedCrc32c(const void* data, size_t size);

// One TFRecord: the length as uint64 little-endian, the masked CRC-32C of those 8 bytes, the
// data, the masked CRC-32C of the data (each CRC as uint32 little-endian).
std::string FrameTfRecord(absl::string_view data);

// The records of a TFRecord file, each checksum checked (an error names the file and the
// offset). A record cut short at the end (a writer killed mid-record) ends the list; `bytes`
// counts the whole records.
struct TfRecords {
  std::vector<std::string> records;
  int64_t bytes = 0;
};
absl::StatusOr<TfRecords> ReadTfRecords(const std::string& path);

// A scalar as TensorBoard shows it: in run `run` (a directory under run.dir/tensorboard),
// named `tag`, at `step`.
struct TensorBoardScalar {
  std::string run;
  std::string tag;
  int64_t step = 0;
  double value = 0;
};

// The scalars of one metrics.jsonl row: every number and boolean (as 0/1) of it, tagged
// "<kind>/<key>" ("bubble/<index>_<bubble kind>/<key>", "side_task/<name>/rank<R>/<key>",
// nested objects and lists by "/<key>" and "/<i>"), in run "stage<S>" for a row of one stage
// and "pipeline" otherwise; the per-stage lists of a train row (bubble_s, host_peak_bytes,
// device_bytes) go to each stage's run under one tag, so TensorBoard draws the stages on one
// chart. Nulls (a loss that was not finite) are left out.
std::vector<TensorBoardScalar> ScalarsOfMetricsRow(const nlohmann::json& row);

class TensorBoardWriter {
 public:
  // Writes event files under `dir` (run.dir/tensorboard), one per run, named as TensorFlow
  // names them (events.out.tfevents.<unix time>.<host>). `resume_step` > 0 continues the
  // newest file of each run there, without the records of steps after `resume_step` (those the
  // stopped run wrote after its checkpoint, as metrics.jsonl drops them).
  static absl::StatusOr<std::unique_ptr<TensorBoardWriter>> Open(const std::string& dir,
                                                                 int64_t resume_step);

  // Adds the scalars of `jsonl`'s rows (one or more metrics.jsonl lines) and flushes, so that a
  // TensorBoard watching the directory sees each step as it ends.
  absl::Status AddRows(absl::string_view jsonl);

 private:
  explicit TensorBoardWriter(std::string dir) : dir_(std::move(dir)) {}
  absl::StatusOr<std::ofstream*> FileOf(const std::string& run);

  std::string dir_;
  std::map<std::string, std::string> resumed_;  // run -> its event file, trimmed, to append to
  std::map<std::string, std::ofstream> files_;
};

}  // namespace freeride
