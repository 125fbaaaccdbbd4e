#include "trainer/data/corpus.h"

#include <zlib.h>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/files.h"
#include "core/json_fields.h"

namespace freeride {
namespace {

bool IsGzip(absl::string_view bytes) {
  return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
         static_cast<unsigned char>(bytes[1]) == 0x8b;
}

absl::StatusOr<std::string> Gunzip(absl::string_view in, const std::string& path) {
  std::string out;
  z_stream z{};
  // 16 + MAX_WBITS: a gzip wrapper, not zlib's.
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) {
    return absl::InternalError(absl::StrCat(path, ": zlib cannot start inflating"));
  }
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  char buffer[1 << 16];
  int rc = Z_OK;
  while (true) {
    z.next_out = reinterpret_cast<Bytef*>(buffer);
    z.avail_out = sizeof(buffer);
    rc = inflate(&z, Z_NO_FLUSH);
    out.append(buffer, sizeof(buffer) - z.avail_out);
    if (rc == Z_STREAM_END) {
      // Another member may follow (concatenated .gz files are one stream to gzip).
      if (z.avail_in == 0) break;
      if (inflateReset(&z) != Z_OK) break;
      continue;
    }
    if (rc != Z_OK) break;
    if (z.avail_in == 0 && z.avail_out != 0) {
      rc = Z_BUF_ERROR;  // input ended inside a member
      break;
    }
  }
  const int64_t consumed = static_cast<int64_t>(in.size() - z.avail_in);
  const std::string why = z.msg != nullptr ? z.msg : "";
  inflateEnd(&z);
  if (rc != Z_STREAM_END) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: corrupt or truncated gzip data after %d of %d compressed bytes%s", path, consumed,
        in.size(), why.empty() ? "" : absl::StrCat(" (", why, ")")));
  }
  return out;
}

absl::Status JsonlDocuments(absl::string_view text, const std::string& path,
                            const std::string& field,
                            const std::function<absl::Status(absl::string_view)>& document) {
  int64_t line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    const std::string where = absl::StrFormat("%s:%d", path, line_no);
    absl::StatusOr<nlohmann::json> record = ParseJsonObject(line, where);
    if (!record.ok()) return absl::InvalidArgumentError(record.status().message());
    absl::StatusOr<std::string> doc = JsonFields(*record, where).String(field);
    if (!doc.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          doc.status().message(), " (the field with each record's text: --text_field)"));
    }
    if (doc->empty()) continue;
    if (absl::Status s = document(*doc); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CorpusFormat> CorpusFormatOf(const std::string& path, const CorpusOptions& options) {
  if (options.format == "text") return CorpusFormat::kText;
  if (options.format == "jsonl") return CorpusFormat::kJsonl;
  if (options.format != "auto") {
    return absl::InvalidArgumentError(
        absl::StrFormat("--format takes auto, text or jsonl, found '%s'", options.format));
  }
  absl::string_view name = path;
  absl::ConsumeSuffix(&name, ".gz");
  return absl::EndsWith(name, ".jsonl") || absl::EndsWith(name, ".ndjson") ? CorpusFormat::kJsonl
                                                                           : CorpusFormat::kText;
}

absl::StatusOr<std::string> ReadMaybeGzip(const std::string& path) {
  if (absl::Status s = CheckRegularFile(path); !s.ok()) return s;
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  if (!IsGzip(*bytes)) return bytes;
  return Gunzip(*bytes, path);
}

absl::Status ForEachDocument(const std::string& path, const CorpusOptions& options,
                             const std::function<absl::Status(absl::string_view)>& document) {
  absl::StatusOr<CorpusFormat> format = CorpusFormatOf(path, options);
  if (!format.ok()) return format.status();
  absl::StatusOr<std::string> text = ReadMaybeGzip(path);
  if (!text.ok()) return text.status();
  if (*format == CorpusFormat::kJsonl) {
    return JsonlDocuments(*text, path, options.text_field, document);
  }
  if (!options.text_lines) {
    if (text->empty()) return absl::OkStatus();
    absl::Status s = document(*text);
    return s.ok() ? s : absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  }
  int64_t line_no = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    ++line_no;
    absl::ConsumeSuffix(&line, "\r");
    if (line.empty()) continue;
    if (absl::Status s = document(line); !s.ok()) {
      return absl::Status(s.code(), absl::StrFormat("%s:%d: %s", path, line_no, s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace freeride
