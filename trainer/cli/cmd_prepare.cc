#include "trainer/cli/cmd_prepare.h"

#include <algorithm>
#include <iostream>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/files.h"
#include "core/status.h"
#include "core/timer.h"
#include "models/tokenizer.h"
#include "trainer/cli/cli.h"
#include "trainer/data/corpus.h"
#include "trainer/data/token_shards.h"

namespace freeride {
namespace {

// Shards of at most shard_tokens each, 16-bit where the vocabulary fits, else 32-bit.
absl::Status WriteShards(const std::string& dir, const std::string& split,
                         const std::vector<uint32_t>& tokens, int64_t shard_tokens, bool wide) {
  for (int64_t start = 0, index = 0; start < static_cast<int64_t>(tokens.size());
       start += shard_tokens, ++index) {
    const int64_t end = std::min<int64_t>(tokens.size(), start + shard_tokens);
    const std::string path = absl::StrFormat("%s/%s_%06d.bin", dir, split, index);
    absl::Status s;
    if (wide) {
      s = WriteTokenShard(path,
                          std::vector<uint32_t>(tokens.begin() + start, tokens.begin() + end));
    } else {
      s = WriteTokenShard(path,
                          std::vector<uint16_t>(tokens.begin() + start, tokens.begin() + end));
    }
    if (!s.ok()) return s;
    std::cout << absl::StrFormat("prepare: wrote %s (%d tokens%s)\n", path, end - start,
                                 wide ? ", 32-bit" : "");
  }
  return absl::OkStatus();
}

// The tokenizer the flags name: GPT-2's (--tokenizer), or any ranks file (--ranks) with its
// pattern and special tokens.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const ParsedFlags& flags) {
  if (!flags.Has("ranks")) {
    if (flags.Has("pattern") || flags.Has("special")) {
      return UsageError(absl::InvalidArgumentError("--pattern and --special go with --ranks FILE"));
    }
    return Tokenizer::Load(flags.Get("tokenizer", kDefaultTokenizerPath));
  }
  if (flags.Has("tokenizer")) {
    return UsageError(
        absl::InvalidArgumentError("give --tokenizer (GPT-2's ranks) or --ranks, not both"));
  }
  std::map<std::string, int32_t> specials;
  for (const std::string& spec : flags.GetAll("special")) {
    const size_t eq = spec.rfind('=');
    int32_t id = -1;
    if (eq == std::string::npos || eq == 0 || !absl::SimpleAtoi(spec.substr(eq + 1), &id) ||
        id < 0) {
      return UsageError(absl::InvalidArgumentError(absl::StrFormat(
          "--special %s: expected TEXT=ID, e.g. --special '<|endoftext|>=100257'", spec)));
    }
    specials[spec.substr(0, eq)] = id;
  }
  return Tokenizer::LoadRanks(flags.Get("ranks"), TokenizerPattern(flags.Get("pattern", "gpt2")),
                              specials);
}

}  // namespace

std::vector<FlagSpec> PrepareFlags() {
  return {{"input", "FILE",
           "a corpus file: text (one document, or one per line with --lines) or JSON Lines "
           "(.jsonl: one document per record), either gzip'd",
           true},
          {"out", "DIR", "where train_NNNNNN.bin and val_NNNNNN.bin go"},
          {"format", "auto|text|jsonl",
           "how to read every input (default auto: .jsonl and .ndjson, gzip'd or not, are JSON "
           "Lines)"},
          {"text_field", "NAME", "JSON Lines: the field holding each record's text (default text)"},
          {"lines", "", "text inputs: one document per non-empty line instead of per file"},
          {"tokenizer", "FILE", "GPT-2 BPE ranks (default data/r50k_base.tiktoken)"},
          {"ranks", "FILE", "any tiktoken-format ranks file instead of GPT-2's"},
          {"pattern", "gpt2|cl100k|o200k|REGEX",
           "with --ranks: the pre-tokenizer (tiktoken's by encoding name, or a regex; default "
           "gpt2)"},
          {"special", "TEXT=ID", "with --ranks: a special token of the encoding", true},
          {"eot", "TEXT", "the special token that leads each document (default <|endoftext|>)"},
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
  CorpusOptions corpus;
  corpus.format = flags.Get("format", "auto");
  corpus.text_field = flags.Get("text_field", "text");
  corpus.text_lines = flags.Has("lines");
  if (absl::StatusOr<CorpusFormat> f = CorpusFormatOf("", corpus); !f.ok()) {
    std::cerr << "error: " << f.status().message() << "\n";
    return kExitUsage;
  }
  auto tokenizer = LoadTokenizer(flags);
  if (!tokenizer.ok()) {
    std::cerr << "error: " << tokenizer.status().message() << "\n";
    return IsUsageError(tokenizer.status()) ? kExitUsage : kExitFailure;
  }
  absl::StatusOr<int32_t> eot = (*tokenizer)->Special(flags.Get("eot", "<|endoftext|>"));
  if (!eot.ok()) {
    std::cerr << "error: --eot: " << eot.status().message() << "\n";
    return kExitUsage;
  }
  Timer timer;
  std::vector<uint32_t> tokens;
  int64_t bytes = 0, documents = 0;
  for (const std::string& input : inputs) {
    absl::Status s = ForEachDocument(input, corpus, [&](absl::string_view doc) -> absl::Status {
      absl::StatusOr<std::vector<int32_t>> ids = (*tokenizer)->Encode(doc);
      if (!ids.ok()) return ids.status();
      if (ids->empty()) return absl::OkStatus();
      bytes += static_cast<int64_t>(doc.size());
      ++documents;
      tokens.push_back(static_cast<uint32_t>(*eot));
      for (int32_t id : *ids) tokens.push_back(static_cast<uint32_t>(id));
      return absl::OkStatus();
    });
    if (!s.ok()) {
      std::cerr << "error: " << s.message() << "\n";
      return kExitFailure;
    }
  }
  if (static_cast<int64_t>(tokens.size()) < 2 * val_tokens) {
    std::cerr << absl::StrFormat(
        "error: the corpus has %d tokens: too few to hold out %d for validation and train on "
        "the rest (give more text or a smaller --val_tokens)\n",
        tokens.size(), val_tokens);
    return kExitFailure;
  }
  const int32_t vocab = (*tokenizer)->vocab_size();
  const bool wide = vocab > 65536;
  std::cout << absl::StrFormat(
      "prepare: %d files, %d documents, %d bytes -> %d tokens in %.2f s; vocabulary %d "
      "(model.vocab_size = %d), %d-bit shards\n",
      inputs.size(), documents, bytes, tokens.size(), timer.ElapsedSeconds(), vocab, vocab,
      wide ? 32 : 16);
  if (absl::Status s = MakeDirectories(out); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return kExitFailure;
  }
  const std::vector<uint32_t> val(tokens.begin(), tokens.begin() + val_tokens);
  const std::vector<uint32_t> train(tokens.begin() + val_tokens, tokens.end());
  absl::Status s = WriteShards(out, "val", val, shard_tokens, wide);
  if (s.ok()) s = WriteShards(out, "train", train, shard_tokens, wide);
  if (!s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace freeride
