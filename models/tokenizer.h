// GPT-2's byte-pair encoding, byte-exact with tiktoken's `gpt2` encoding: the r50k ranks file
// (`data/r50k_base.tiktoken`, one "base64-bytes rank" per line) and GPT-2's pre-tokenizer
// regex run by PCRE2 with Unicode properties.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace freeride {

inline constexpr int32_t kEndOfText = 50256;
inline constexpr const char* kDefaultTokenizerPath = "data/r50k_base.tiktoken";

class Tokenizer {
 public:
  // Errors name the file and line, and how to fetch the file when it is missing.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path);
  ~Tokenizer();

  // Ordinary text to tokens (no special tokens are recognised). Invalid UTF-8 is an error.
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text);
  // Tokens to bytes; <|endoftext|> prints as itself. Unknown ids are an error.
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& tokens) const;
  // Vocabulary size including <|endoftext|> (50257 for r50k).
  int32_t vocab_size() const { return static_cast<int32_t>(id_to_bytes_.size()) + 1; }

 private:
  Tokenizer() = default;
  void EncodePiece(absl::string_view piece, std::vector<int32_t>* out);

  absl::flat_hash_map<std::string, int32_t> ranks_;
  std::vector<std::string> id_to_bytes_;
  absl::flat_hash_map<std::string, std::vector<int32_t>> cache_;
  struct Regex;
  std::unique_ptr<Regex> regex_;
};

}  // namespace freeride
