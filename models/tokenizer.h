// Byte-pair encoding as tiktoken does it: a ranks file (one "base64-bytes rank" per line, ranks
// 0, 1, 2, ... in order), a pre-tokenizer regex run by PCRE2 with Unicode properties, and
// special tokens beside the ranks. Load() is GPT-2's, byte-exact with tiktoken's `gpt2`
// encoding (`data/r50k_base.tiktoken` and <|endoftext|> = 50256); LoadRanks() takes any ranks
// file with its pattern and special tokens.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace freeride {

inline constexpr int32_t kEndOfText = 50256;
inline constexpr const char* kDefaultTokenizerPath = "data/r50k_base.tiktoken";

// tiktoken's pre-tokenizer patterns by encoding name; any other value of a `pattern` is taken
// as the regex itself.
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr const char* kCl100kPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr const char* kO200kPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// "gpt2", "cl100k" or "o200k" to its pattern; anything else is returned as it is.
std::string TokenizerPattern(const std::string& name_or_regex);

class Tokenizer {
 public:
  // GPT-2's: 50,256 ranks and <|endoftext|> = 50256. Errors name the file and line, and how to
  // fetch the file when it is missing.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path);
  // Any ranks file, split by `pattern` (a regex), with `specials` (text → id, ids at or past
  // the ranks). Errors name the file and line, or the pattern, or the special token.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> LoadRanks(
      const std::string& path, const std::string& pattern,
      const std::map<std::string, int32_t>& specials);
  ~Tokenizer();

  // Ordinary text to tokens (no special tokens are recognised). Invalid UTF-8 is an error.
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text);
  // Tokens to bytes; a special token prints as its text. Unknown ids are an error.
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& tokens) const;
  // Vocabulary size: every rank and special token (50257 for r50k).
  int32_t vocab_size() const { return vocab_size_; }
  // The id of special token `text`, or NotFound naming the ones there are.
  absl::StatusOr<int32_t> Special(const std::string& text) const;

 private:
  Tokenizer() = default;
  void EncodePiece(absl::string_view piece, std::vector<int32_t>* out);

  absl::flat_hash_map<std::string, int32_t> ranks_;
  std::vector<std::string> id_to_bytes_;
  std::map<int32_t, std::string> specials_;  // id → text
  int32_t vocab_size_ = 0;
  absl::flat_hash_map<std::string, std::vector<int32_t>> cache_;
  struct Regex;
  std::unique_ptr<Regex> regex_;
};

}  // namespace freeride
