// Tokenizer against an independent implementation's golden output, token shards, loader.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "trainer/data/token_shards.h"
#include "models/tokenizer.h"

namespace freeride {
namespace {

std::string DataTemp(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) / name).string();
}

Tokenizer& Gpt2() {
  static Tokenizer* tokenizer = [] {
    auto t = Tokenizer::Load(kDefaultTokenizerPath);
    EXPECT_TRUE(t.ok()) << t.status() << " (run launch/fetch_tokenizer.sh)";
    return t.ok() ? t->release() : nullptr;
  }();
  if (tokenizer == nullptr) std::abort();
  return *tokenizer;
}

std::vector<int32_t> Encode(const std::string& text) {
  auto ids = Gpt2().Encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

TEST(TokenizerTest, KnownVectors) {
  EXPECT_EQ(Encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(Encode(" Hello world"), (std::vector<int32_t>{18435, 995}));
  EXPECT_EQ(Encode("Hello, world!"), (std::vector<int32_t>{15496, 11, 995, 0}));
  EXPECT_EQ(Encode("\n\n"), (std::vector<int32_t>{628}));
  EXPECT_EQ(Encode("33333"), (std::vector<int32_t>{2091, 20370}));
  EXPECT_EQ(Gpt2().vocab_size(), 50257);
}

// tests/data/tokenizer/r50k_golden.tsv comes from the npm package gpt-tokenizer
// (tests/golden/make_tokenizer_golden.mjs): Unicode, contractions, whitespace runs, emoji,
// numbers, code and Bible text.
TEST(TokenizerTest, MatchesIndependentImplementationByteForByte) {
  std::ifstream in("tests/data/tokenizer/r50k_golden.tsv");
  ASSERT_TRUE(in) << "missing golden file";
  std::string line;
  int cases = 0;
  while (std::getline(in, line)) {
    std::vector<std::string> parts = absl::StrSplit(line, '\t');
    ASSERT_EQ(parts.size(), 2u);
    const std::string text = absl::HexStringToBytes(parts[0]);
    std::vector<int32_t> expected;
    for (absl::string_view id : absl::StrSplit(parts[1], ' ', absl::SkipEmpty())) {
      int32_t v;
      ASSERT_TRUE(absl::SimpleAtoi(id, &v));
      expected.push_back(v);
    }
    const std::vector<int32_t> got = Encode(text);
    EXPECT_EQ(got, expected) << "text: " << text.substr(0, 80);
    auto decoded = Gpt2().Decode(got);
    ASSERT_TRUE(decoded.ok());
    EXPECT_EQ(*decoded, text);
    ++cases;
  }
  EXPECT_EQ(cases, 17);
}

TEST(TokenizerTest, ClearErrors) {
  auto bad = Gpt2().Encode(std::string("ok \xff\xfe bytes"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("not valid UTF-8 at byte 3"), std::string::npos);
  EXPECT_FALSE(Gpt2().Decode({50257}).ok());
  auto missing = Tokenizer::Load(DataTemp("nope.tiktoken"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("launch/prepare_data.sh"), std::string::npos);
  std::ofstream(DataTemp("bad.tiktoken")) << "IQ== 0\nnot-a-line\n";
  auto malformed = Tokenizer::Load(DataTemp("bad.tiktoken"));
  ASSERT_FALSE(malformed.ok());
  EXPECT_NE(malformed.status().message().find("bad.tiktoken:2:"), std::string::npos);
}

std::vector<uint16_t> Iota(int n) {
  std::vector<uint16_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<uint16_t>(i);
  return v;
}

TEST(TokenLoaderTest, LlmcWindowsAndShardRollover) {
  ASSERT_TRUE(WriteTokenShard(DataTemp("roll_000.bin"), Iota(25)).ok());
  ASSERT_TRUE(WriteTokenShard(DataTemp("roll_001.bin"), Iota(13)).ok());
  auto loader = TokenLoader::Open(DataTemp("roll_*.bin"), 2, 4, false, 0);
  ASSERT_TRUE(loader.ok()) << loader.status();
  EXPECT_EQ(loader->batches_per_epoch(), 3 + 1);
  std::vector<int32_t> x(8), y(8);
  // Shard 0 has windows at 0, 8, 16 (24 + 1 <= 25); then shard 1's window at 0.
  for (int32_t start : {0, 8, 16, 0, 0}) {
    loader->Next(x.data(), y.data());
    EXPECT_EQ(x[0], start);
    EXPECT_EQ(y[7], start + 8);
  }
  EXPECT_EQ(loader->position().epoch, 1);
}

TEST(TokenLoaderTest, ShuffleIsSeededPermutationAndSeekResumes) {
  ASSERT_TRUE(WriteTokenShard(DataTemp("shuf.bin"), Iota(801)).ok());
  auto a = TokenLoader::Open(DataTemp("shuf.bin"), 1, 8, true, 42);
  auto b = TokenLoader::Open(DataTemp("shuf.bin"), 1, 8, true, 42);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<int32_t> x(8), y(8), x2(8);
  std::set<int32_t> starts;
  bool in_order = true;
  for (int i = 0; i < 100; ++i) {
    a->Next(x.data(), y.data());
    b->Next(x2.data(), y.data());
    EXPECT_EQ(x, x2);
    starts.insert(x[0]);
    in_order = in_order && x[0] == i * 8;
  }
  EXPECT_EQ(starts.size(), 100u);  // every window once per epoch
  EXPECT_FALSE(in_order);
  for (int i = 0; i < 7; ++i) a->Next(x.data(), y.data());
  const LoaderPosition saved = a->position();
  a->Next(x.data(), y.data());
  b->Seek(saved);
  b->Next(x2.data(), y.data());
  EXPECT_EQ(x, x2);
}

TEST(TokenShardTest, BadShardsGiveClearErrors) {
  std::ofstream(DataTemp("junk.bin")) << "junk";
  EXPECT_NE(ReadTokenShard(DataTemp("junk.bin")).status().message().find("shorter than"),
            std::string::npos);
  ASSERT_TRUE(WriteTokenShard(DataTemp("short.bin"), Iota(5)).ok());
  auto loader = TokenLoader::Open(DataTemp("short.bin"), 2, 4, false, 0);
  ASSERT_FALSE(loader.ok());
  EXPECT_NE(loader.status().message().find("5 tokens, but one batch of 2 × 4 needs 9"),
            std::string::npos);
  std::filesystem::resize_file(DataTemp("short.bin"), 1024 + 4);
  EXPECT_NE(ReadTokenShard(DataTemp("short.bin")).status().message().find("(truncated)"),
            std::string::npos);
  EXPECT_NE(TokenLoader::Open(DataTemp("none_*.bin"), 1, 1, false, 0)
                .status()
                .message()
                .find("no token shards match"),
            std::string::npos);
}

// A FIFO must not block the open (nothing ever writes it: the run would hang before its first
// step), a directory is not "truncated", and a device is not data.
TEST(TokenShardTest, OnlyRegularFilesAreRead) {
  const std::string fifo = DataTemp("shard_fifo.bin"), dir = DataTemp("shard_dir");
  std::filesystem::remove(fifo);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::filesystem::create_directories(dir);
  for (const auto& [path, words] :
       {std::pair<std::string, std::string>{fifo, "is a FIFO (named pipe), not a regular file"},
        {dir, "is a directory, not a regular file: give its shards, e.g. \"" + dir + "/*.bin\""},
        {"/dev/zero", "is a character device, not a regular file"}}) {
    absl::StatusOr<TokenLoader> loader = TokenLoader::Open(path, 1, 1, false, 0);
    ASSERT_FALSE(loader.ok()) << path;
    EXPECT_NE(loader.status().message().find(path + ": " + words), std::string::npos)
        << loader.status().message();
    EXPECT_EQ(loader.status().message().find("truncated"), std::string::npos);
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> ranks = Tokenizer::Load(fifo);
  ASSERT_FALSE(ranks.ok());
  EXPECT_NE(ranks.status().message().find("is a FIFO"), std::string::npos) << ranks.status();
}

}  // namespace
}  // namespace freeride
