#include "trainer/tensorboard.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/checksum.h"
#include "core/files.h"
#include "core/json_fields.h"
#include "trainer/tensorboard_event.pb.h"

namespace freeride {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

void AppendLe(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(value >> (8 * i) & 0xff));
}

uint64_t ReadLe(const char* p, int bytes) {
  uint64_t value = 0;
  for (int i = bytes - 1; i >= 0; --i) value = value << 8 | static_cast<unsigned char>(p[i]);
  return value;
}

double WallTime() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string SerializedEvent(const tensorboard::Event& event) {
  std::string bytes;
  event.SerializeToString(&bytes);
  return bytes;
}

// The first record of every event file: the format's version, which TensorBoard checks.
std::string VersionRecord() {
  tensorboard::Event event;
  event.set_wall_time(WallTime());
  event.set_file_version("brain.Event:2");
  return FrameTfRecord(SerializedEvent(event));
}

bool PerStageList(const std::string& kind, const std::string& key) {
  return kind == "train" &&
         (key == "bubble_s" || key == "host_peak_bytes" || key == "device_bytes");
}

void AddValue(const json& value, const std::string& run, const std::string& tag, int64_t step,
              std::vector<TensorBoardScalar>& out) {
  if (value.is_boolean()) {
    out.push_back({run, tag, step, value.get<bool>() ? 1.0 : 0.0});
  } else if (value.is_number()) {
    out.push_back({run, tag, step, value.get<double>()});
  } else if (value.is_array()) {
    for (size_t i = 0; i < value.size(); ++i) {
      AddValue(value[i], run, absl::StrFormat("%s/%d", tag, i), step, out);
    }
  } else if (value.is_object()) {
    for (const auto& [key, item] : value.items()) AddValue(item, run, tag + "/" + key, step, out);
  }  // strings (times, names, reasons) and nulls are no scalars
}

}  // namespace

uint32_t MaskedCrc32c(const void* data, size_t size) {
  const uint32_t crc = Crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string FrameTfRecord(absl::string_view data) {
  std::string out;
  AppendLe(out, data.size(), 8);
  AppendLe(out, MaskedCrc32c(out.data(), 8), 4);
  out.append(data.data(), data.size());
  AppendLe(out, MaskedCrc32c(data.data(), data.size()), 4);
  return out;
}

absl::StatusOr<TfRecords> ReadTfRecords(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  TfRecords out;
  const std::string& b = *text;
  size_t at = 0;
  while (b.size() - at >= 12) {
    const uint64_t length = ReadLe(&b[at], 8);
    if (ReadLe(&b[at + 8], 4) != MaskedCrc32c(&b[at], 8)) {
      return absl::DataLossError(absl::StrFormat(
          "%s: the record at byte %d: its length's checksum does not match", path, at));
    }
    if (b.size() - at - 12 < length + 4) break;  // cut short by a kill
    const char* data = &b[at + 12];
    if (ReadLe(data + length, 4) != MaskedCrc32c(data, length)) {
      return absl::DataLossError(absl::StrFormat(
          "%s: the record at byte %d: its data's checksum does not match", path, at));
    }
    out.records.emplace_back(data, length);
    at += 16 + length;
  }
  out.bytes = static_cast<int64_t>(at);
  return out;
}

std::vector<TensorBoardScalar> ScalarsOfMetricsRow(const json& row) {
  std::vector<TensorBoardScalar> out;
  if (!row.is_object() || !row.contains("kind") || !row["kind"].is_string() ||
      !row.contains("step") || !row["step"].is_number_integer()) {
    return out;
  }
  const std::string kind = row["kind"];
  const int64_t step = row["step"];
  const std::string run =
      row.contains("stage") ? absl::StrFormat("stage%d", JsonIntOr(row, "stage", -1)) : "pipeline";
  std::string prefix = kind;
  if (kind == "bubble") {
    // One series per bubble across re-placements: its anchor (rows written before it existed:
    // the index, which step 1's re-placement may change).
    prefix = row.contains("anchor")
                 ? absl::StrFormat("bubble/a%d_%s", JsonIntOr(row, "anchor", 0),
                                   JsonStringOr(row, "bubble_kind", ""))
                 : absl::StrFormat("bubble/%d_%s", JsonIntOr(row, "index", 0),
                                   JsonStringOr(row, "bubble_kind", ""));
  } else if (kind == "side_task") {
    prefix = absl::StrFormat("side_task/%s/rank%d", JsonStringOr(row, "name", ""),
                             JsonIntOr(row, "rank", 0));
  }
  for (const auto& [key, value] : row.items()) {
    if (key == "kind" || key == "step" || key == "stage" || key == "index" || key == "anchor" ||
        key == "rank" || key == "from_step") {
      continue;
    }
    if (PerStageList(kind, key) && value.is_array()) {
      for (size_t s = 0; s < value.size(); ++s) {
        AddValue(value[s], absl::StrFormat("stage%d", s), kind + "/" + key, step, out);
      }
      continue;
    }
    AddValue(value, run, prefix + "/" + key, step, out);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::Open(const std::string& dir,
                                                                           int64_t resume_step) {
  if (absl::Status s = MakeDirectories(dir); !s.ok()) return s;
  std::unique_ptr<TensorBoardWriter> writer(new TensorBoardWriter(dir));
  if (resume_step <= 0) return writer;
  std::error_code ec;
  for (fs::directory_iterator run(dir, ec), end; !ec && run != end; run.increment(ec)) {
    if (!run->is_directory()) continue;
    std::vector<std::string> files;
    for (fs::directory_iterator f(run->path(), ec), e; !ec && f != e; f.increment(ec)) {
      if (absl::StartsWith(f->path().filename().string(), "events.out.tfevents.")) {
        files.push_back(f->path().string());
      }
    }
    if (files.empty()) continue;
    // The newest: names differ in their unix time, of equal length for centuries.
    const std::string newest = *std::max_element(files.begin(), files.end());
    absl::StatusOr<TfRecords> records = ReadTfRecords(newest);
    if (!records.ok()) return records.status();
    std::string kept;
    for (const std::string& record : records->records) {
      tensorboard::Event event;
      if (!event.ParseFromString(record)) {
        return absl::DataLossError(newest + ": a record is not a TensorFlow Event");
      }
      if (event.has_file_version() || event.step() <= resume_step) {
        kept += FrameTfRecord(record);
      }
    }
    if (absl::Status s = WriteFileAtomically(newest, kept); !s.ok()) return s;
    writer->resumed_[run->path().filename().string()] = newest;
  }
  return writer;
}

absl::StatusOr<std::ofstream*> TensorBoardWriter::FileOf(const std::string& run) {
  auto it = files_.find(run);
  if (it != files_.end()) return &it->second;
  std::string path;
  bool fresh = false;
  if (auto r = resumed_.find(run); r != resumed_.end()) {
    path = r->second;
  } else {
    const std::string run_dir = (fs::path(dir_) / run).string();
    if (absl::Status s = MakeDirectories(run_dir); !s.ok()) return s;
    char host[256] = "localhost";
    gethostname(host, sizeof(host) - 1);
    path = (fs::path(run_dir) / absl::StrFormat("events.out.tfevents.%d.%s",
                                                static_cast<int64_t>(std::time(nullptr)), host))
               .string();
    fresh = true;
  }
  std::ofstream& out = files_[run];
  out.open(path, std::ios::binary | std::ios::app);
  if (!out) return absl::InternalError("cannot write " + path);
  if (fresh) out << VersionRecord();
  return &out;
}

absl::Status TensorBoardWriter::AddRows(absl::string_view jsonl) {
  std::map<std::string, tensorboard::Event> events;  // one per (run, step) of these rows
  std::vector<std::pair<std::string, int64_t>> order;
  for (absl::string_view line : absl::StrSplit(jsonl, '\n', absl::SkipEmpty())) {
    const json row = json::parse(line, nullptr, /*allow_exceptions=*/false);
    for (const TensorBoardScalar& s : ScalarsOfMetricsRow(row)) {
      const std::string key = absl::StrFormat("%s\n%d", s.run, s.step);
      auto [it, added] = events.try_emplace(key);
      if (added) {
        it->second.set_wall_time(WallTime());
        it->second.set_step(s.step);
        order.emplace_back(s.run, s.step);
      }
      tensorboard::SummaryValue* v = it->second.mutable_summary()->add_value();
      v->set_tag(s.tag);
      v->set_simple_value(static_cast<float>(s.value));
    }
  }
  std::vector<std::ofstream*> touched;
  for (const auto& [run, step] : order) {
    absl::StatusOr<std::ofstream*> out = FileOf(run);
    if (!out.ok()) return out.status();
    **out << FrameTfRecord(SerializedEvent(events[absl::StrFormat("%s\n%d", run, step)]));
    touched.push_back(*out);
  }
  for (std::ofstream* out : touched) {
    if (!out->flush()) return absl::InternalError("cannot write an event file in " + dir_);
  }
  return absl::OkStatus();
}

}  // namespace freeride
