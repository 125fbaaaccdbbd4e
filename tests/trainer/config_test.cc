#include "trainer/config/config.h"

#include <cstdlib>

#include "core/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer/config/default_config.h"

namespace freeride {
namespace {

using testing::ElementsAre;
using testing::HasSubstr;

constexpr char kMinimal[] = "[data]\ntrain = \"shards/*.bin\"\n";

std::string ErrorOf(absl::string_view text, const std::vector<std::string>& overrides = {}) {
  absl::StatusOr<Config> config = ParseConfig(text, "test.toml", overrides);
  EXPECT_FALSE(config.ok()) << "parsed although invalid:\n" << text;
  return config.ok() ? "" : std::string(config.status().message());
}

TEST(ConfigTest, DefaultsFillEveryKeyNotGiven) {
  absl::StatusOr<Config> config = ParseConfig(kMinimal, "test.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  Config defaults;
  EXPECT_EQ(config->data.train, "shards/*.bin");
  EXPECT_EQ(config->model.n_layer, defaults.model.n_layer);
  EXPECT_EQ(config->optim.lr, defaults.optim.lr);
  EXPECT_EQ(config->parallel.schedule, "1f1b");
  EXPECT_EQ(config->runtime.device, "cpu");
  EXPECT_TRUE(config->side_tasks.empty());
}

TEST(ConfigTest, ReadsEveryType) {
  absl::StatusOr<Config> config = ParseConfig(R"(
[run]
seed = 7
[data]
train = "a.bin"
shuffle = true
[optim]
lr = 3     # an integer is accepted where a number is expected
eps = 1e-6
[model]
n_layer = 6
[parallel]
pp = 3
layers_per_stage = [1, 2, 3]
)",
                                              "test.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->run.seed, 7);
  EXPECT_TRUE(config->data.shuffle);
  EXPECT_EQ(config->optim.lr, 3.0);
  EXPECT_EQ(config->optim.eps, 1e-6);
  EXPECT_THAT(config->parallel.layers_per_stage, ElementsAre(1, 2, 3));
}

TEST(ConfigTest, SyntaxErrorNamesLineAndColumn) {
  EXPECT_THAT(ErrorOf("[data]\ntrain = \"x\"\nbatch = = 3\n"),
              HasSubstr("test.toml:3:"));
  EXPECT_THAT(ErrorOf("[data]\ntrain = \"x\"\nbatch = = 3\n"), HasSubstr("TOML syntax error"));
}

TEST(ConfigTest, UnknownKeyNamesLineKeyAndSuggestion) {
  std::string error = ErrorOf("[data]\ntrain = \"x\"\n[train]\nbatch_sise = 4\n");
  EXPECT_THAT(error, HasSubstr("test.toml:4:1: train.batch_sise: unknown key"));
  EXPECT_THAT(error, HasSubstr("did you mean 'batch_size'?"));
}

TEST(ConfigTest, UnknownSectionIsAnError) {
  std::string error = ErrorOf("[data]\ntrain = \"x\"\n[optimizer]\nlr = 1.0\n");
  EXPECT_THAT(error, HasSubstr("test.toml:3:2: optimizer: unknown section"));
  EXPECT_THAT(error, HasSubstr("did you mean 'optim'?"));
}

TEST(ConfigTest, WrongTypeNamesExpectedAndFound) {
  EXPECT_EQ(ErrorOf("[data]\ntrain = \"x\"\n[train]\nsteps = \"ten\"\n"),
            "test.toml:4:9: train.steps: expected an integer >= 0, found a string (\"ten\")");
  EXPECT_EQ(ErrorOf("[data]\ntrain = 5\n"),
            "test.toml:2:9: data.train: expected a string, found an integer (5)");
  EXPECT_EQ(ErrorOf("[data]\ntrain = \"x\"\n[train]\nsteps = 2.5\n"),
            "test.toml:4:9: train.steps: expected an integer >= 0, found a number (2.5)");
  EXPECT_THAT(ErrorOf("[data]\ntrain = \"x\"\n[parallel]\nlayers_per_stage = [1, \"a\"]\n"),
              HasSubstr("parallel.layers_per_stage: expected a list of integers, found an "
                        "array holding a string"));
  EXPECT_THAT(ErrorOf("data = 3\n"), HasSubstr("data: expected a table ([data]), found an "
                                                "integer (3)"));
}

TEST(ConfigTest, OutOfRangeNamesTheBound) {
  EXPECT_EQ(ErrorOf("[data]\ntrain = \"x\"\n[train]\nbatch_size = 0\n"),
            "test.toml:4:14: train.batch_size: expected an integer >= 1, found an integer (0)");
  EXPECT_EQ(ErrorOf("[data]\ntrain = \"x\"\n[optim]\nbeta2 = 1.0\n"),
            "test.toml:4:9: optim.beta2: expected a number in [0.0, 1.0), found a number (1.0)");
  EXPECT_EQ(ErrorOf("[data]\ntrain = \"x\"\n[optim]\nlr = 0.0\n"),
            "test.toml:4:6: optim.lr: expected a number > 0.0, found a number (0.0)");
  EXPECT_EQ(ErrorOf("[data]\ntrain = \"x\"\n[parallel]\nschedule = \"pipedream\"\n"),
            "test.toml:4:12: parallel.schedule: expected one of \"gpipe\", \"1f1b\", "
            "\"interleaved\", \"zbh1\", \"zbh2\", \"zbv\", \"dualpipev\", \"file\", found a "
            "string (\"pipedream\")");
}

TEST(ConfigTest, DpBucketMbIsANumberAtLeastZero) {
  EXPECT_EQ(ErrorOf("[data]\ntrain = \"x\"\n[parallel]\ndp_bucket_mb = -1.5\n"),
            "test.toml:4:16: parallel.dp_bucket_mb: expected a number >= 0.0, found a number "
            "(-1.5)");
  EXPECT_EQ(ErrorOf("[data]\ntrain = \"x\"\n[parallel]\ndp_bucket_mb = \"4MB\"\n"),
            "test.toml:4:16: parallel.dp_bucket_mb: expected a number >= 0.0, found a string "
            "(\"4MB\")");
  absl::StatusOr<Config> c =
      ParseConfig("[data]\ntrain = \"x\"\n[parallel]\ndp_bucket_mb = 25\n", "test.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->parallel.dp_bucket_mb, 25.0);
}

TEST(ConfigTest, DpBucketMbHasALowerBoundAboveZeroStatedInTheError) {
  const std::string error = ErrorOf("[data]\ntrain = \"x\"\n[parallel]\ndp_bucket_mb = 1e-7\n");
  EXPECT_THAT(error, HasSubstr("parallel.dp_bucket_mb: expected 0 (one sum per model chunk) or "
                               "at least 0.00390625 (4 KiB: buckets of 1024 floats or more), "
                               "found 1e-07"));
  EXPECT_TRUE(ParseConfig("[data]\ntrain = \"x\"\n[parallel]\ndp_bucket_mb = 0.00390625\n",
                          "test.toml")
                  .ok());
  EXPECT_TRUE(ParseConfig("[data]\ntrain = \"x\"\n[parallel]\ndp_bucket_mb = 0\n", "test.toml")
                  .ok());
}

TEST(ConfigTest, MissingRequiredKeyIsNamed) {
  EXPECT_THAT(ErrorOf("[train]\nsteps = 3\n"),
              HasSubstr("test.toml: data.train: required key missing"));
  EXPECT_THAT(ErrorOf("[data]\nval = \"v.bin\"\n"),
              HasSubstr("test.toml:1:2: data.train: required key missing"));
}

TEST(ConfigTest, EveryProblemIsReportedOnItsOwnLine) {
  std::string error = ErrorOf("[data]\ntrain = 1\n[train]\nsteps = -1\nbogus = 2\n");
  EXPECT_EQ(std::count(error.begin(), error.end(), '\n'), 2) << error;
  EXPECT_THAT(error, HasSubstr("data.train"));
  EXPECT_THAT(error, HasSubstr("train.steps"));
  EXPECT_THAT(error, HasSubstr("train.bogus"));
}

TEST(ConfigTest, CrossKeyRulesNameTheKeyTheyBlame) {
  EXPECT_EQ(ErrorOf("[data]\ntrain = \"x\"\n[train]\nbatch_size = 6\nmicrobatches = 4\n"),
            "test.toml:4:14: train.batch_size: expected a multiple of train.microbatches (4), "
            "found 6");
  EXPECT_THAT(ErrorOf("[data]\ntrain = \"x\"\n[model]\nn_embd = 100\nn_head = 3\n"),
              HasSubstr("model.n_embd: expected a multiple of model.n_head (3), found 100"));
  EXPECT_THAT(ErrorOf("[data]\ntrain = \"x\"\n[train]\nseq_len = 512\n"),
              HasSubstr("train.seq_len: expected at most model.max_seq_len (256), found 512"));
  EXPECT_THAT(ErrorOf("[data]\ntrain = \"x\"\n[parallel]\nschedule = \"interleaved\"\n"),
              HasSubstr("parallel.chunks: expected at least 2 for the interleaved schedule"));
  EXPECT_THAT(ErrorOf("[data]\ntrain = \"x\"\n[parallel]\npp = 8\n"),
              HasSubstr("parallel.pp: expected at most model.n_layer (4) model chunks"));
  EXPECT_THAT(ErrorOf("[data]\ntrain = \"x\"\n[parallel]\npp = 2\nlayers_per_stage = [1, 2]\n"),
              HasSubstr("expected 2 positive counts (pp × chunks) summing to model.n_layer (4), "
                        "found [1, 2] (2 entries, sum 3)"));
  EXPECT_THAT(ErrorOf("[data]\ntrain = \"x\"\n[runtime]\nprecision = \"bf16\"\n"),
              HasSubstr("runtime.precision: expected \"fp32\" on the cpu device"));
  EXPECT_THAT(ErrorOf("[data]\ntrain = \"x\"\n[eval]\nevery = 5\n"),
              HasSubstr("eval.every: expected 0 when data.val is empty"));
}

TEST(ConfigTest, SideTasksParseWithDefaultsAndArgs) {
  absl::StatusOr<Config> config = ParseConfig(R"(
[data]
train = "x"
[parallel]
pp = 2
[[side_tasks]]
type = "pagerank"
priority = 2
memory_limit = "512MiB"
stages = [1]
[side_tasks.args]
graph = "rmat"
scale = 12
damping = 0.85
sizes = [64, 128]
[[side_tasks]]
type = "image"
)",
                                              "test.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->side_tasks.size(), 2u);
  const SideTaskConfig& pagerank = config->side_tasks[0];
  EXPECT_EQ(pagerank.name, "pagerank");
  EXPECT_EQ(pagerank.priority, 2);
  EXPECT_EQ(pagerank.memory_limit_bytes, 512 << 20);
  EXPECT_THAT(pagerank.stages, ElementsAre(1));
  EXPECT_EQ(std::get<std::string>(pagerank.args.at("graph")), "rmat");
  EXPECT_EQ(std::get<int64_t>(pagerank.args.at("scale")), 12);
  EXPECT_EQ(std::get<double>(pagerank.args.at("damping")), 0.85);
  EXPECT_THAT(std::get<std::vector<int64_t>>(pagerank.args.at("sizes")), ElementsAre(64, 128));
  EXPECT_TRUE(config->side_tasks[1].stages.empty());  // "all"
  EXPECT_EQ(config->side_tasks[1].name, "image");
}

TEST(ConfigTest, SideTaskErrorsNameTheTableAndKey) {
  const std::string head = "[data]\ntrain = \"x\"\n";
  EXPECT_THAT(ErrorOf(head + "[[side_tasks]]\nname = \"a\"\n"),
              HasSubstr("test.toml:3:1: side_tasks[0].type: required key missing"));
  EXPECT_THAT(ErrorOf(head + "[[side_tasks]]\ntype = \"spin\"\nstages = [0, 5]\n"),
              HasSubstr("side_tasks[0].stages: expected stage numbers below parallel.pp (1), "
                        "found 5"));
  EXPECT_THAT(ErrorOf(head + "[[side_tasks]]\ntype = \"spin\"\nmemory_limit = \"lots\"\n"),
              HasSubstr("test.toml:5:16: side_tasks[0].memory_limit: expected bytes >= 0 or a "
                        "size such as \"512MiB\", found a string (\"lots\")"));
  EXPECT_THAT(ErrorOf(head + "[[side_tasks]]\ntype = \"spin\"\nargz = 1\n"),
              HasSubstr("side_tasks[0].argz: unknown key (did you mean 'args'?)"));
  EXPECT_THAT(ErrorOf(head + "[[side_tasks]]\ntype = \"spin\"\n[[side_tasks]]\ntype = \"spin\"\n"),
              HasSubstr("side_tasks[1].name: expected a name not already used by side_tasks[0]"));
  EXPECT_THAT(ErrorOf(head + "[[side_tasks]]\ntype = \"spin\"\n[side_tasks.args]\nx = {a = 1}\n"),
              HasSubstr("side_tasks[0].args.x: expected a boolean, number, string"));
}

// A task's name becomes `<run.dir>/<name>_r<rank>`: a name with a path in it is refused where
// it was written.
TEST(ConfigTest, SideTaskNamesThatAreNotPlainFileNamesAreRefused) {
  const std::string head = "[data]\ntrain = \"x\"\n[[side_tasks]]\ntype = \"spin\"\n";
  for (const char* bad : {"../../escape", "a/b", ".hidden", "-flag", "white space"}) {
    EXPECT_THAT(ErrorOf(head + "name = \"" + bad + "\"\n"),
                HasSubstr(std::string("test.toml:5:8: side_tasks[0].name: expected a name of "
                                      "letters, digits, '_', '-' and '.'")))
        << bad;
  }
  EXPECT_THAT(ErrorOf(head, {"side_tasks.0.name=../x"}),
              HasSubstr("side_tasks[0].name: expected a name of letters"));
  EXPECT_TRUE(ParseConfig(head + "name = \"spin-2.fast_A\"\n", "test.toml").ok());
}

TEST(ConfigTest, EffectiveConfigRoundTripsExactly) {
  absl::StatusOr<Config> config = ParseConfig(R"(
[data]
train = "we \"quote\" \\ things\u007f"
[optim]
lr = 0.1
eps = 1e-300
[parallel]
pp = 2
[[side_tasks]]
type = "image"
memory_limit = 1000
[side_tasks.args]
"odd key" = ["a", "b"]
blur = 1.5
)",
                                              "test.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  const std::string text = ConfigToToml(*config);
  absl::StatusOr<Config> again = ParseConfig(text, "effective.toml");
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << text;
  EXPECT_EQ(ConfigToToml(*again), text);
  EXPECT_EQ(again->data.train, "we \"quote\" \\ things\x7f");  // DEL, escaped in TOML
  EXPECT_EQ(again->optim.eps, 1e-300);
  EXPECT_EQ(again->side_tasks[0].memory_limit_bytes, 1000);
  EXPECT_THAT(std::get<std::vector<std::string>>(again->side_tasks[0].args.at("odd key")),
              ElementsAre("a", "b"));
}

TEST(ConfigTest, ByteSizes) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096);
  EXPECT_EQ(*ParseByteSize("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("2 GiB"), int64_t{2} << 30);
  EXPECT_EQ(*ParseByteSize("1.5K"), 1536);
  EXPECT_EQ(*ParseByteSize("100MB"), 100000000);
  EXPECT_FALSE(ParseByteSize("12 parsecs").ok());
  EXPECT_FALSE(ParseByteSize("MiB").ok());
  EXPECT_FALSE(ParseByteSize("0.3").ok());
  EXPECT_EQ(FormatByteSize(int64_t{3} << 30), "3GiB");
  EXPECT_EQ(FormatByteSize(1000), "1000");
  EXPECT_EQ(FormatByteSize(0), "0");
}

TEST(ConfigTest, LlamaKeysAreCheckedNamingTheKey) {
  EXPECT_THAT(ErrorOf("[data]\ntrain = \"x\"\n[model]\narch = \"llama\"\nn_kv_head = 3\n"),
              HasSubstr("model.n_kv_head: expected a divisor of model.n_head (4), found 3"));
  EXPECT_THAT(
      ErrorOf("[data]\ntrain = \"x\"\n[model]\narch = \"llama\"\nn_head = 4\nn_embd = 12\n"),
      HasSubstr("model.n_embd: expected an even head size for rotary embeddings"));
  // Both backends run Llama, recomputation included (the CUDA one in fp32 and bf16).
  EXPECT_TRUE(ParseConfig("[data]\ntrain = \"x\"\n[model]\narch = \"llama\"\nrecompute = "
                          "\"full\"\n[runtime]\ndevice = \"cuda\"\nprecision = \"bf16\"\n",
                          "test.toml")
                  .ok());
  EXPECT_TRUE(
      ParseConfig("[data]\ntrain = \"x\"\n[model]\narch = \"llama\"\nrecompute = \"full\"\n",
                  "test.toml")
          .ok());
  EXPECT_THAT(ErrorOf("[data]\ntrain = \"x\"\n[model]\narch = \"mamba\"\n"),
              HasSubstr("model.arch"));
  EXPECT_THAT(ErrorOf("[data]\ntrain = \"x\"\n[model]\nn_kv_head = 2\n"),
              HasSubstr("model.n_kv_head: expected 0 or model.n_head for model.arch = \"gpt2\""));
  EXPECT_THAT(ErrorOf("[data]\ntrain = \"x\"\n[model]\ntie_embeddings = false\n"),
              HasSubstr("model.tie_embeddings: expected true for model.arch = \"gpt2\""));
  EXPECT_THAT(ErrorOf("[data]\ntrain = \"x\"\n[model]\narch = \"llama\"\nrope_theta = 0\n"),
              HasSubstr("model.rope_theta"));
}

TEST(ConfigTest, ShippedConfigsAndEmbeddedDefaultAreValid) {
  for (const char* path :
       {"configs/tiny_cpu.toml", "configs/gpt2_124m.toml", "configs/llama_tiny_cpu.toml"}) {
    absl::StatusOr<Config> config = LoadConfigFile(path);
    EXPECT_TRUE(config.ok()) << path << ": " << config.status();
  }
  absl::StatusOr<Config> embedded = ParseConfig(DefaultConfigToml(), kDefaultConfigName);
  ASSERT_TRUE(embedded.ok()) << embedded.status();
  EXPECT_EQ(ConfigToToml(*embedded), ConfigToToml(*LoadConfigFile("configs/tiny_cpu.toml")));
}

TEST(ConfigTest, CommittedReferenceMatchesTheSchema) {
  absl::StatusOr<std::string> committed = ReadFile("docs/config.md");
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(*committed, ConfigReferenceMarkdown())
      << "docs/config.md is out of date: run `build/freeride config docs > docs/config.md`";
}

}  // namespace
}  // namespace freeride
