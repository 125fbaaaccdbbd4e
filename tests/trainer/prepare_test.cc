// `freeride prepare` beyond one text file per document: JSON Lines (a field per record), gzip'd
// inputs, one document per line, any tiktoken ranks file with its special tokens, and 32-bit
// shards for ids past 65,535 that the loader reads and a run trains on.
#include <zlib.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/tokenizer.h"
#include "tests/trainer/run_cli.h"
#include "tests/trainer/tiny_run.h"
#include "trainer/data/corpus.h"
#include "trainer/data/token_shards.h"

namespace freeride {
namespace {

using ::testing::HasSubstr;

void WriteGzip(const std::string& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())),
            static_cast<int>(text.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

std::string Verse(int i) {
  return absl::StrCat("And it came to pass on day ", i,
                      " that the people went up to the mountain, and they sang.");
}

std::vector<uint32_t> ShardTokens(const std::string& path) {
  absl::StatusOr<TokenShard> shard = ReadTokenShard(path);
  EXPECT_TRUE(shard.ok()) << shard.status();
  std::vector<uint32_t> out;
  if (shard.ok()) {
    for (int64_t i = 0; i < shard->size(); ++i) out.push_back((*shard)[i]);
  }
  return out;
}

TEST(PrepareTest, GzippedJsonLinesBecomeShardsThatTrain) {
  std::string jsonl;
  for (int i = 0; i < 60; ++i) {
    jsonl += absl::StrCat(R"({"id": )", i, R"(, "body": ")", Verse(i), "\"}\n");
    if (i == 3) jsonl += "\n";  // blank lines are skipped
  }
  const std::string corpus = Temp("corpus.jsonl.gz"), data = Temp("prep_jsonl"),
                    run = Temp("prep_jsonl_run");
  WriteGzip(corpus, jsonl);
  std::filesystem::remove_all(data);
  std::filesystem::remove_all(run);
  const CliResult prep = RunCommand(
      {"prepare", "--input", corpus, "--out", data, "--text_field", "body", "--val_tokens", "100"});
  ASSERT_EQ(prep.status, 0) << prep.err;
  EXPECT_THAT(prep.out, HasSubstr("60 documents"));
  // Each record is a document led by <|endoftext|>.
  auto gpt2 = Tokenizer::Load(kDefaultTokenizerPath);
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  std::vector<uint32_t> expected;
  for (int i = 0; i < 60; ++i) {
    absl::StatusOr<std::vector<int32_t>> ids = (*gpt2)->Encode(Verse(i));
    ASSERT_TRUE(ids.ok()) << ids.status();
    expected.push_back(kEndOfText);
    expected.insert(expected.end(), ids->begin(), ids->end());
  }
  std::vector<uint32_t> tokens = ShardTokens(data + "/val_000000.bin");
  const std::vector<uint32_t> train = ShardTokens(data + "/train_000000.bin");
  tokens.insert(tokens.end(), train.begin(), train.end());
  EXPECT_EQ(tokens, expected);

  const CliResult trained = RunCommand({"train",
                                        "--set",
                                        "run.dir=\"" + run + "\"",
                                        "--set",
                                        "data.train=\"" + data + "/train_*.bin\"",
                                        "--set",
                                        "data.val=\"" + data + "/val_*.bin\"",
                                        "--set",
                                        "model.n_layer=1",
                                        "--set",
                                        "model.n_embd=16",
                                        "--set",
                                        "model.n_head=2",
                                        "--set",
                                        "train.steps=3",
                                        "--set",
                                        "train.seq_len=16",
                                        "--set",
                                        "train.batch_size=2",
                                        "--set",
                                        "train.microbatches=1",
                                        "--set",
                                        "eval.every=3",
                                        "--set",
                                        "eval.batches=1"});
  ASSERT_EQ(trained.status, 0) << trained.err;
  EXPECT_TRUE(std::filesystem::exists(run + "/checkpoints/step_00000003/model.bin"));
}

TEST(PrepareTest, BadRecordsAreNamedByFileLineAndField) {
  const std::string data = Temp("prep_bad");
  auto refusal = [&](const std::string& name, const std::string& text) {
    const std::string path = Temp(name);
    EXPECT_TRUE(WriteFileAtomically(path, text).ok());
    const CliResult r = RunCommand({"prepare", "--input", path, "--out", data});
    EXPECT_EQ(r.status, 1) << r.err;
    return r.err;
  };
  EXPECT_THAT(refusal("bad1.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\"\n"),
              HasSubstr("bad1.jsonl:2"));
  EXPECT_THAT(refusal("bad2.jsonl", "{\"text\": \"a\"}\n\n{\"content\": \"b\"}\n"),
              HasSubstr("bad2.jsonl:3: \"text\" is missing"));
  EXPECT_THAT(refusal("bad3.jsonl", "{\"text\": 12}\n"), HasSubstr("bad3.jsonl:1"));
  EXPECT_THAT(refusal("bad3.jsonl", "{\"text\": 12}\n"), HasSubstr("--text_field"));
  // A gzip stream cut short is named, whatever the file's name.
  const std::string gz = Temp("cut.txt");
  WriteGzip(gz, std::string(5000, 'x') + "some text that compresses");
  std::filesystem::resize_file(gz, std::filesystem::file_size(gz) - 10);
  const CliResult cut = RunCommand({"prepare", "--input", gz, "--out", data});
  EXPECT_EQ(cut.status, 1);
  EXPECT_THAT(cut.err, HasSubstr(gz + ": corrupt or truncated gzip data"));
  EXPECT_EQ(RunCommand({"prepare", "--input", gz, "--out", data, "--format", "csv"}).status, 2);
  EXPECT_EQ(RunCommand({"prepare", "--input", gz, "--out", data, "--pattern", "gpt2"}).status, 2);
}

TEST(PrepareTest, TextLinesAreDocumentsWithLines) {
  const std::string path = Temp("lines.txt");
  ASSERT_TRUE(WriteFileAtomically(path, "first line\r\n\nsecond line\nthird\n").ok());
  std::vector<std::string> docs;
  CorpusOptions options;
  auto collect = [&](absl::string_view d) {
    docs.emplace_back(d);
    return absl::OkStatus();
  };
  ASSERT_TRUE(ForEachDocument(path, options, collect).ok());
  EXPECT_EQ(docs, std::vector<std::string>{"first line\r\n\nsecond line\nthird\n"});
  docs.clear();
  options.text_lines = true;
  ASSERT_TRUE(ForEachDocument(path, options, collect).ok());
  EXPECT_EQ(docs, (std::vector<std::string>{"first line", "second line", "third"}));
}

// A ranks file of `n` ranks: the 256 bytes, unreachable fillers, and " t", " th", " the" as the
// last three, so that " the" encodes past 65,535.
std::string WriteWideRanks(int n) {
  std::string text;
  auto add = [&](const std::string& bytes, int rank) {
    std::string b64;
    absl::Base64Escape(bytes, &b64);
    absl::StrAppend(&text, b64, " ", rank, "\n");
  };
  for (int b = 0; b < 256; ++b) add(std::string(1, static_cast<char>(b)), b);
  for (int r = 256; r < n - 3; ++r) {
    const int k = r - 256;
    add(std::string{static_cast<char>(0xf8), static_cast<char>(0x80 + k % 64),
                    static_cast<char>(0x80 + (k / 64) % 64), static_cast<char>(0x80 + k / 4096)},
        r);
  }
  add(" t", n - 3);
  add(" th", n - 2);
  add(" the", n - 1);
  const std::string path = Temp("wide.tiktoken");
  EXPECT_TRUE(WriteFileAtomically(path, text).ok());
  return path;
}

TEST(PrepareTest, AWideVocabularyMakes32BitShardsThatTrain) {
  const int ranks = 70000;
  const std::string ranks_file = WriteWideRanks(ranks);
  auto tok = Tokenizer::LoadRanks(ranks_file, TokenizerPattern("gpt2"), {{"<|eot|>", 70000}});
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 70001);
  EXPECT_EQ(*(*tok)->Encode("a the"), (std::vector<int32_t>{'a', 69999}));
  EXPECT_EQ(*(*tok)->Decode({'a', 69999, 70000}), "a the<|eot|>");

  std::string text;
  for (int i = 0; i < 400; ++i) absl::StrAppend(&text, "the cat saw the dog\n");
  const std::string corpus = Temp("wide.txt"), data = Temp("prep_wide"), run = Temp("wide_run");
  ASSERT_TRUE(WriteFileAtomically(corpus, text).ok());
  std::filesystem::remove_all(data);
  std::filesystem::remove_all(run);
  const CliResult prep =
      RunCommand({"prepare", "--input", corpus, "--out", data, "--lines", "--ranks", ranks_file,
                  "--special", "<|eot|>=70000", "--eot", "<|eot|>", "--val_tokens", "200"});
  ASSERT_EQ(prep.status, 0) << prep.err;
  EXPECT_THAT(prep.out, HasSubstr("vocabulary 70001 (model.vocab_size = 70001), 32-bit shards"));
  const std::vector<uint32_t> val = ShardTokens(data + "/val_000000.bin");
  ASSERT_GE(val.size(), 3u);
  EXPECT_EQ(val[0], 70000u);  // each line a document led by the end-of-text token
  EXPECT_TRUE(ReadTokenShard(data + "/val_000000.bin")->wide());

  absl::StatusOr<TokenLoader> loader = TokenLoader::Open(data + "/train_*.bin", 2, 8, false, 0);
  ASSERT_TRUE(loader.ok()) << loader.status();
  EXPECT_EQ(loader->max_token(), 70000);

  const CliResult trained = RunCommand({"train",
                                        "--set",
                                        "run.dir=\"" + run + "\"",
                                        "--set",
                                        "data.train=\"" + data + "/train_*.bin\"",
                                        "--set",
                                        "model.vocab_size=70001",
                                        "--set",
                                        "model.n_layer=1",
                                        "--set",
                                        "model.n_embd=16",
                                        "--set",
                                        "model.n_head=2",
                                        "--set",
                                        "train.steps=2",
                                        "--set",
                                        "train.seq_len=16",
                                        "--set",
                                        "train.batch_size=2",
                                        "--set",
                                        "train.microbatches=1",
                                        "--set",
                                        "data.val=\"\"",
                                        "--set",
                                        "eval.every=0"});
  ASSERT_EQ(trained.status, 0) << trained.err;
  // The same shards under a vocabulary that does not hold their ids are refused by the id.
  const CliResult narrow = RunCommand({"train",
                                       "--set",
                                       "run.dir=\"" + run + "_narrow\"",
                                       "--set",
                                       "data.train=\"" + data + "/train_*.bin\"",
                                       "--set",
                                       "model.n_layer=1",
                                       "--set",
                                       "model.n_embd=16",
                                       "--set",
                                       "model.n_head=2",
                                       "--set",
                                       "train.steps=1",
                                       "--set",
                                       "train.seq_len=16",
                                       "--set",
                                       "train.batch_size=2",
                                       "--set",
                                       "train.microbatches=1",
                                       "--set",
                                       "data.val=\"\"",
                                       "--set",
                                       "eval.every=0",
                                       "--overwrite"});
  EXPECT_NE(narrow.status, 0);
  EXPECT_THAT(narrow.err, HasSubstr("holds token 70000 but model.vocab_size is 50257"));
}

TEST(TokenShardTest, BothWidthsReadBackAndTheLoaderServesWideIds) {
  const std::vector<uint32_t> wide = {1, 65535, 65536, 70000, 4000000, 7, 8, 9, 10};
  ASSERT_TRUE(WriteTokenShard(Temp("wide.bin"), wide).ok());
  EXPECT_EQ(ShardTokens(Temp("wide.bin")), wide);
  absl::StatusOr<TokenLoader> loader = TokenLoader::Open(Temp("wide.bin"), 2, 4, false, 0);
  ASSERT_TRUE(loader.ok()) << loader.status();
  std::vector<int32_t> x(8), y(8);
  loader->Next(x.data(), y.data());
  EXPECT_EQ(x, (std::vector<int32_t>{1, 65535, 65536, 70000, 4000000, 7, 8, 9}));
  EXPECT_EQ(y, (std::vector<int32_t>{65535, 65536, 70000, 4000000, 7, 8, 9, 10}));
  EXPECT_EQ(loader->max_token(), 4000000);
  // A wide shard cut short says so with its 4-byte width.
  std::filesystem::resize_file(Temp("wide.bin"), 1024 + 4 * 9 - 2);
  EXPECT_THAT(std::string(ReadTokenShard(Temp("wide.bin")).status().message()),
              HasSubstr("header says 9 tokens (1060 bytes with the header)"));
}

}  // namespace
}  // namespace freeride
