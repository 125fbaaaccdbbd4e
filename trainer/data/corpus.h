// The documents of a corpus file, for `freeride prepare`: plain text (the whole file one
// document, or one per line) or JSON Lines (one document per record: the string at a field,
// "text" by default), either of them gzip-compressed (found by the gzip magic bytes, whatever
// the file's name). A record that is not a JSON object, lacks the field or holds another type
// there is an error naming the file, line and field.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace freeride {

enum class CorpusFormat { kText, kJsonl };

struct CorpusOptions {
  // auto: JSON Lines for names ending .jsonl or .ndjson (before any .gz), else text.
  std::string format = "auto";
  std::string text_field = "text";  // JSON Lines: each record's document
  bool text_lines = false;          // text: one document per non-empty line, not per file
};

// The format `options` gives `path`; an unknown options.format is an error.
absl::StatusOr<CorpusFormat> CorpusFormatOf(const std::string& path, const CorpusOptions& options);

// The bytes of `path`, decompressed when it is gzip (several members are read one after the
// other, as gzip does). A truncated or corrupt gzip stream is an error naming the file.
absl::StatusOr<std::string> ReadMaybeGzip(const std::string& path);

// Calls `document` with each non-empty document of `path`, in order; its error stops the walk
// and is returned.
absl::Status ForEachDocument(const std::string& path, const CorpusOptions& options,
                             const std::function<absl::Status(absl::string_view)>& document);

}  // namespace freeride
