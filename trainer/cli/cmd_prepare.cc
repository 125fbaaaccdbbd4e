#include "trainer/cli/cmd_prepare.h"

#include <algorithm>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "core/files.h"
#include "core/timer.h"
#include "trainer/cli/cli.h"
#include "trainer/data/token_shards.h"
#include "models/tokenizer.h"

namespace freeride {
namespace {

absl::Status WriteShards(const std::string& dir, const std::string& split,
                         const std::vector<uint16_t>& tokens, int64_t shard_tokens) {
  for (int64_t start = 0, index = 0; start < static_cast<int64_t>(tokens.size());
       start += shard_tokens, ++index) {
    const int64_t end = std::min<int64_t>(tokens.size(), start + shard_tokens);
    const std::string path = absl::StrFormat("%s/%s_%06d.bin", dir, split, index);
    std::vector<uint16_t> part(tokens.begin() + start, tokens.begin() + end);
    if (absl::Status s = WriteTokenShard(path, part); !s.ok()) return s;
    std::cout << absl::StrFormat("prepare: wrote %s (%d tokens)\n", path, part.size());
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<FlagSpec> PrepareFlags() {
  return {{"input", "FILE", "a text file; each is one document, led by <|endoftext|>", true},
          {"out", "DIR", "where train_NNNNNN.bin and val_NNNNNN.bin go"},
          {"tokenizer", "FILE", "GPT-2 BPE ranks (default data/r50k_base.tiktoken)"},
          {"val_tokens", "N", "tokens held out for validation, from the start (default 32768)"},
          {"shard_tokens", "N", "tokens per shard file at most (default 100000000)"}};
}

int PrepareCommand(const ParsedFlags& flags) {
  const std::vector<std::string> inputs = flags.GetAll("input");
  const std::string out = flags.Get("out");
  int64_t val_tokens = 32768, shard_tokens = 100000000;
  if (inputs.empty() || out.empty()) {
    std::cerr << "error: prepare needs --input FILE (one or more) and --out DIR\n";
    return kExitUsage;
  }
  if (!absl::SimpleAtoi(flags.Get("val_tokens", "32768"), &val_tokens) || val_tokens < 1 ||
      !absl::SimpleAtoi(flags.Get("shard_tokens", "100000000"), &shard_tokens) ||
      shard_tokens < 1) {
    std::cerr << "error: --val_tokens and --shard_tokens take positive integers\n";
    return kExitUsage;
  }
  auto tokenizer = Tokenizer::Load(flags.Get("tokenizer", kDefaultTokenizerPath));
  if (!tokenizer.ok()) {
    std::cerr << "error: " << tokenizer.status().message() << "\n";
    return kExitFailure;
  }
  Timer timer;
  std::vector<uint16_t> tokens;
  int64_t bytes = 0;
  for (const std::string& input : inputs) {
    absl::StatusOr<std::string> text = ReadFile(input);
    if (!text.ok()) {
      std::cerr << "error: " << input << ": " << text.status().message() << "\n";
      return kExitFailure;
    }
    absl::StatusOr<std::vector<int32_t>> ids = (*tokenizer)->Encode(*text);
    if (!ids.ok()) {
      std::cerr << "error: " << input << ": " << ids.status().message() << "\n";
      return kExitFailure;
    }
    if (ids->empty()) continue;
    bytes += static_cast<int64_t>(text->size());
    tokens.push_back(static_cast<uint16_t>(kEndOfText));
    for (int32_t id : *ids) tokens.push_back(static_cast<uint16_t>(id));
  }
  if (static_cast<int64_t>(tokens.size()) < 2 * val_tokens) {
    std::cerr << absl::StrFormat(
        "error: the corpus has %d tokens: too few to hold out %d for validation and train on "
        "the rest (give more text or a smaller --val_tokens)\n",
        tokens.size(), val_tokens);
    return kExitFailure;
  }
  std::cout << absl::StrFormat("prepare: %d files, %d bytes -> %d tokens in %.2f s\n",
                               inputs.size(), bytes, tokens.size(), timer.ElapsedSeconds());
  if (absl::Status s = MakeDirectories(out); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return kExitFailure;
  }
  const std::vector<uint16_t> val(tokens.begin(), tokens.begin() + val_tokens);
  const std::vector<uint16_t> train(tokens.begin() + val_tokens, tokens.end());
  absl::Status s = WriteShards(out, "val", val, shard_tokens);
  if (s.ok()) s = WriteShards(out, "train", train, shard_tokens);
  {
    if (!s.ok()) {
      std::cerr << "error: " << s.message() << "\n";
      return kExitFailure;
    }
  }
  return kExitOk;
}

}  // namespace freeride
