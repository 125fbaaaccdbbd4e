// The command line, run in-process with stdout and stderr captured.
#include "trainer/cli/cli.h"

#include <filesystem>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/device.h"
#include "core/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/trainer/run_cli.h"

namespace freeride {
namespace {

using testing::HasSubstr;
using testing::Not;

TEST(CliTest, HelpListsCommands) {
  CliResult result = RunCommand({"--help"});
  EXPECT_EQ(result.status, kExitOk);
  EXPECT_THAT(result.out, HasSubstr("config check"));
  EXPECT_THAT(result.out, HasSubstr("version"));
  EXPECT_EQ(RunCommand({}).status, kExitUsage);
}

TEST(CliTest, CommandHelpShowsOptions) {
  CliResult result = RunCommand({"config", "check", "--help"});
  EXPECT_EQ(result.status, kExitOk);
  EXPECT_THAT(result.out, HasSubstr("--set SECTION.KEY=VALUE"));
  EXPECT_EQ(RunCommand({"help", "config", "check"}).out, result.out);
}

TEST(CliTest, UnknownCommandAndOptionAreUsageErrors) {
  CliResult unknown = RunCommand({"trian"});
  EXPECT_EQ(unknown.status, kExitUsage);
  EXPECT_THAT(unknown.err, HasSubstr("unknown command 'trian' (did you mean 'train'?)"));
  CliResult option = RunCommand({"version", "--fast"});
  EXPECT_EQ(option.status, kExitUsage);
  EXPECT_THAT(option.err, HasSubstr("unknown option --fast"));
  CliResult near = RunCommand({"schedule", "--stage", "4"});
  EXPECT_EQ(near.status, kExitUsage);
  EXPECT_THAT(near.err, HasSubstr("unknown option --stage (did you mean --stages?)"));
}

TEST(CliTest, VersionReportsBuildFacts) {
  CliResult result = RunCommand({"version"});
  EXPECT_EQ(result.status, kExitOk);
  for (const char* row : {"freeride", "commit", "CUDA backend", "MPI", "BLAS", "abseil"}) {
    EXPECT_THAT(result.out, HasSubstr(row));
  }
  EXPECT_THAT(result.out, HasSubstr("OpenBLAS"));
#ifdef FREERIDE_WITH_CUDA
  EXPECT_THAT(result.out, HasSubstr("cuDNN"));
  EXPECT_THAT(result.out, HasSubstr("NCCL"));
#endif
}

TEST(CliTest, VersionIsAlsoAnOption) {
  CliResult option = RunCommand({"--version"});
  EXPECT_EQ(option.status, kExitOk);
  EXPECT_EQ(option.out, RunCommand({"version"}).out);
}

// The command names `freeride --help` lists ("config check", "train", ...).
std::vector<std::string> ListedCommands() {
  std::vector<std::string> names;
  std::istringstream lines(RunCommand({"--help"}).out);
  bool in_list = false;
  for (std::string line; std::getline(lines, line);) {
    if (line == "commands:") in_list = true;
    if (!in_list || line.rfind("  ", 0) != 0) continue;
    names.push_back(line.substr(2, line.find("  ", 2) - 2));
  }
  return names;
}

TEST(CliTest, EveryCommandAndGroupHasHelp) {
  const std::vector<std::string> names = ListedCommands();
  ASSERT_GE(names.size(), 15u);
  for (const std::string& name : names) {
    std::vector<std::string> args = absl::StrSplit(name, ' ');
    args.push_back("--help");
    CliResult help = RunCommand(args);
    EXPECT_EQ(help.status, kExitOk) << name;
    EXPECT_THAT(help.out, testing::StartsWith("usage: freeride " + name)) << name;
    args.back() = "-h";
    EXPECT_EQ(RunCommand(args).out, help.out) << name;
  }
  for (const std::string group : {"config", "checkpoint"}) {
    CliResult help = RunCommand({group, "--help"});
    EXPECT_EQ(help.status, kExitOk) << group;
    EXPECT_THAT(help.out, HasSubstr("usage: freeride " + group + " SUBCOMMAND"));
    EXPECT_EQ(RunCommand({"help", group}).out, help.out);
    CliResult bare = RunCommand({group});
    EXPECT_EQ(bare.status, kExitUsage) << group;
    EXPECT_EQ(bare.err, help.out);
  }
  EXPECT_THAT(RunCommand({"config", "--help"}).out,
              testing::AllOf(HasSubstr("config check"), HasSubstr("config memory"),
                             HasSubstr("config docs")));
  CliResult typo = RunCommand({"config", "chek"});
  EXPECT_EQ(typo.status, kExitUsage);
  EXPECT_THAT(typo.err,
              HasSubstr("unknown command 'config chek' (did you mean 'config check'?)"));
  EXPECT_THAT(typo.err, HasSubstr("config check"));
  // Usage lines name what the issue found missing.
  EXPECT_THAT(RunCommand({"sample", "--help"}).out, HasSubstr("[--format text|jsonl]"));
  EXPECT_THAT(RunCommand({"schedule", "--help"}).out, HasSubstr("text|csv|torch|json"));
}

TEST(CliTest, ASpaceInsteadOfEqualsInSetIsSaid) {
  for (std::vector<std::string> args :
       {std::vector<std::string>{"train", "--set", "train.steps", "5"},
        std::vector<std::string>{"config", "check", "--set", "train.steps", "5"}}) {
    CliResult result = RunCommand(args);
    EXPECT_EQ(result.status, kExitUsage);
    EXPECT_THAT(result.err, HasSubstr("error: --set train.steps 5: a space instead of '=' "
                                      "(write --set train.steps=5)"));
  }
}

TEST(CliTest, DevicesAlwaysListsTheCpu) {
  CliResult result = RunCommand({"devices"});
  EXPECT_EQ(result.status, kExitOk);
  EXPECT_THAT(result.out, HasSubstr("cpu "));
}

// Without a usable CUDA device: one plain line ending "CPU only", never the runtime's error
// name; --verbose adds that error where there is one.
TEST(CliTest, DevicesWithoutCudaSaysCpuOnly) {
  if (!DiscoverDevices().cuda.empty()) GTEST_SKIP() << "a CUDA device is visible";
  CliResult result = RunCommand({"devices"});
  EXPECT_EQ(result.status, kExitOk) << result.err;
  EXPECT_THAT(result.out, testing::ContainsRegex("\ncuda: none \\([^\n]*: CPU only\\)\n"));
  EXPECT_THAT(result.out, testing::Not(HasSubstr("cudaError")));
  CliResult verbose = RunCommand({"devices", "--verbose"});
  EXPECT_EQ(verbose.status, kExitOk) << verbose.err;
  EXPECT_THAT(verbose.out, HasSubstr("cuda: none ("));
}

TEST(CliTest, ConfigCheckPrintsEffectiveConfigWithOverrides) {
  CliResult result = RunCommand(
      {"config", "check", "--config_only", "configs/tiny_cpu.toml", "--set", "train.steps=7"});
  EXPECT_EQ(result.status, kExitOk) << result.err;
  EXPECT_THAT(result.out, HasSubstr("[train]"));
  EXPECT_THAT(result.out, HasSubstr("steps = 7\n"));
  EXPECT_THAT(result.out, HasSubstr("lr = 0.003\n"));
}

TEST(CliTest, ConfigCheckWithoutFileUsesTheEmbeddedDefault) {
  CliResult result = RunCommand({"config", "check", "--config_only"});
  EXPECT_EQ(result.status, kExitOk) << result.err;
  EXPECT_THAT(result.out, HasSubstr("dir = \"runs/tiny_cpu\""));
}

TEST(CliTest, BrokenConfigGivesOneErrorLinePerProblemAndFails) {
  std::string path = WriteTemp("broken.toml",
                               "[data]\ntrain = 3\n[train]\nbatch_size = 0\nwhat = 1\n");
  CliResult result = RunCommand({"config", "check", path});
  EXPECT_EQ(result.status, kExitFailure);
  EXPECT_EQ(result.out, "");
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 3) << result.err;
  EXPECT_THAT(result.err, HasSubstr("error: " + path + ":2:9: data.train: expected a string"));
  EXPECT_THAT(result.err, HasSubstr(path + ":4:14: train.batch_size: expected an integer >= 1"));
  EXPECT_THAT(result.err, HasSubstr(path + ":5:1: train.what: unknown key"));
}

// One pass: a key's own error and a rule between two other keys are reported together (the
// rules ran only once every key was right, so fixing one problem revealed the next).
TEST(CliTest, ConfigCheckReportsTypeAndCrossKeyErrorsInOnePass) {
  const std::string path =
      WriteTemp("both.toml", "[data]\ntrain = 3\n[model]\nn_embd = 100\nn_head = 3\n");
  CliResult result = RunCommand({"config", "check", path});
  EXPECT_EQ(result.status, kExitFailure);
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 2) << result.err;
  EXPECT_THAT(result.err, HasSubstr("error: " + path + ":2:9: data.train: expected a string"));
  EXPECT_THAT(result.err, HasSubstr("error: " + path +
                                    ":4:10: model.n_embd: expected a multiple "
                                    "of model.n_head (3), found 100"));
}

// A rule that reads a key with an error of its own is left out: that key holds its default, not
// what was written, and a complaint about the default would be false.
TEST(CliTest, ConfigCheckSkipsTheRulesOfABrokenKey) {
  const std::string path =
      WriteTemp("n_head.toml", "[data]\ntrain = 3\n[model]\nn_embd = 100\nn_head = \"four\"\n");
  CliResult result = RunCommand({"config", "check", path});
  EXPECT_EQ(result.status, kExitFailure);
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 2) << result.err;
  EXPECT_THAT(result.err, HasSubstr(path + ":5:10: model.n_head: expected an integer"));
  EXPECT_THAT(result.err, Not(HasSubstr("model.n_embd")));
}

// A data glob that matches no file is an error naming the key, its line and the glob (it passed,
// and the run failed later); --config_only leaves the files to the ranks that open them.
TEST(CliTest, ConfigCheckRefusesADataGlobThatMatchesNothing) {
  const std::string dir = testing::TempDir() + "glob_check";
  std::filesystem::remove_all(dir);  // a val shard of an earlier run of this test
  ASSERT_TRUE(MakeDirectories(dir).ok());
  WriteTemp("glob_check/train_000.bin", "x");
  const std::string nothing = dir + "/val_*.bin";
  const std::string path = WriteTemp(
      "glob.toml",
      absl::StrCat("[data]\ntrain = \"", dir, "/train_*.bin\"\nval = \"", nothing, "\"\n"));
  CliResult result = RunCommand({"config", "check", path});
  EXPECT_EQ(result.status, kExitFailure);
  EXPECT_EQ(result.err, absl::StrCat("error: ", path,
                                     ":3:7: data.val: expected a file, or a glob "
                                     "matching one (relative to the working directory), found \"",
                                     nothing, "\"\n"));
  EXPECT_EQ(RunCommand({"config", "check", "--config_only", path}).status, kExitOk);
  ASSERT_TRUE(WriteFileAtomically(dir + "/val_000.bin", "x").ok());
  result = RunCommand({"config", "check", path});
  EXPECT_EQ(result.status, kExitOk) << result.err;
}

// `config check` builds each side task as `train` would: type, arguments, plugin and limits,
// every problem on its own line with the file and line it comes from.
TEST(CliTest, ConfigCheckValidatesSideTasks) {
  const std::string base = "[data]\ntrain = \"x_*.bin\"\n[freeride]\nenabled = true\n";
  std::string path = WriteTemp("tasks.toml", base +
      "[[side_tasks]]\ntype = \"no_such_type\"\n"                        // type on line 6
      "[[side_tasks]]\ntype = \"pagerank\"\n[side_tasks.args]\n"
      "damping = \"high\"\n"                                              // line 10
      "[[side_tasks]]\ntype = \"collatz\"\n"
      "plugin = \"/nonexistent/libtask.so\"\n"                            // line 13
      "[[side_tasks]]\ntype = \"spin\"\nmemory_limit = 1125899906842624\n");  // line 16
  CliResult result = RunCommand({"config", "check", "--config_only", path});
  EXPECT_EQ(result.status, kExitFailure);
  EXPECT_EQ(result.out, "");
  EXPECT_THAT(result.err, HasSubstr("error: " + path + ":16:16: side_tasks[3].memory_limit = "));
  EXPECT_THAT(result.err, HasSubstr("is more than stage 0 leaves to side work: "));
  // Limits first; with them right, each task is built.
  path = WriteTemp("tasks.toml", base +
      "[[side_tasks]]\ntype = \"no_such_type\"\n"
      "[[side_tasks]]\ntype = \"pagerank\"\n[side_tasks.args]\n"
      "damping = \"high\"\n"
      "[[side_tasks]]\ntype = \"collatz\"\n"
      "plugin = \"/nonexistent/libtask.so\"\n");
  result = RunCommand({"config", "check", "--config_only", path});
  EXPECT_EQ(result.status, kExitFailure);
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 3) << result.err;
  EXPECT_THAT(result.err, HasSubstr("error: " + path + ":6:8: side_tasks[0] ('no_such_type', "
                                    "no_such_type): unknown side task type 'no_such_type'"));
  EXPECT_THAT(result.err, HasSubstr("error: " + path + ":10:11: side_tasks[1] ('pagerank', "
                                    "pagerank): side task 'pagerank': args.damping: expected"));
  EXPECT_THAT(result.err, HasSubstr("error: " + path + ":13:10: side_tasks[2] ('collatz', "
                                    "collatz): side task plugin /nonexistent/libtask.so "
                                    "cannot be loaded"));
}

TEST(CliTest, ConfigCheckBuildsProcessIsolatedTasksInAWorker) {
  const std::string path = WriteTemp("isolated.toml",
      "[data]\ntrain = \"x_*.bin\"\n[freeride]\nenabled = true\n"
      "[[side_tasks]]\ntype = \"pagerank\"\nisolation = \"process\"\n[side_tasks.args]\n"
      "scale = 8\n"
      "[[side_tasks]]\ntype = \"spin\"\nisolation = \"process\"\n[side_tasks.args]\n"
      "steps = -1\n");
  CliResult result = RunCommand({"config", "check", "--config_only", path});
  EXPECT_EQ(result.status, kExitFailure);
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
  EXPECT_THAT(result.err, HasSubstr(path + ":14:9: side_tasks[1] ('spin', spin): side task 'spin': "
                                    "args.steps: expected"));
}

TEST(CliTest, ACommandTaskCannotRunInProcess) {
  const std::string path = WriteTemp("command.toml",
      "[data]\ntrain = \"x_*.bin\"\n[[side_tasks]]\ntype = \"command\"\n"
      "isolation = \"inprocess\"\n[side_tasks.args]\nargv = [\"true\"]\n");
  CliResult result = RunCommand({"config", "check", "--config_only", path});
  EXPECT_EQ(result.status, kExitFailure);
  EXPECT_THAT(result.err, HasSubstr(path + ":5:13: side_tasks[0].isolation: expected \"process\" "
                                    "for a `command` task"));
}

// Two servers on one port would collide on a host their ranks share: two serve tasks on one
// port, and one task on a port bound by each of its ranks, are refused with the lines of both.
TEST(CliTest, ServeTasksThatWouldShareAPortAreRefused) {
  auto task = [](const std::string& name, const std::string& stages, int port) {
    return absl::StrCat("[[side_tasks]]\ntype = \"serve\"\nname = \"", name,
                        "\"\nstages = ", stages, "\n[side_tasks.args]\n",
                        "checkpoint = \"tests/data/gpt2_golden/model.bin\"\nport = ", port, "\n");
  };
  const std::string head = "[data]\ntrain = \"x_*.bin\"\n[parallel]\npp = 2\n";  // 4 lines
  // Tasks on lines 5-11, 12-18 and 19-25; their ports on lines 11, 18 and 25.
  const std::string path =
      WriteTemp("ports.toml", head + task("a", "[0]", 8200) + task("b", "[1]", 8200) +
                                  task("c", "\"all\"", 8300));
  CliResult result = RunCommand({"config", "check", "--config_only", path});
  EXPECT_EQ(result.status, kExitFailure);
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 2) << result.err;
  EXPECT_THAT(result.err,
              HasSubstr(path + ":18:8: side_tasks[1].args.port = 8200: side_tasks[0] ('a', " +
                        path + ":11:8) serves on this port too"));
  EXPECT_THAT(result.err, HasSubstr(path + ":25:8: side_tasks[2].args.port = 8300: the task runs "
                                           "on 2 ranks (2 stages x parallel.dp = 1)"));
  // One port each, and port = 0 (any free port) on every rank: accepted.
  const std::string fine =
      WriteTemp("ports_ok.toml",
                head + task("a", "[0]", 8200) + task("b", "[1]", 8201) + task("c", "\"all\"", 0));
  result = RunCommand({"config", "check", "--config_only", fine});
  EXPECT_EQ(result.status, kExitOk) << result.err;
}

TEST(CliTest, SideTaskNamesThatArePathsAreRefusedWithTheirLine) {
  const std::string path = WriteTemp("escape.toml",
      "[data]\ntrain = \"x_*.bin\"\n[freeride]\nenabled = true\n"
      "[[side_tasks]]\ntype = \"spin\"\nname = \"../../escape\"\n");
  CliResult result = RunCommand({"config", "check", "--config_only", path});
  EXPECT_EQ(result.status, kExitFailure);
  EXPECT_THAT(result.err, HasSubstr(path + ":7:8: side_tasks[0].name: expected a name of letters, "
                                    "digits, '_', '-' and '.'"));
  EXPECT_THAT(result.err, HasSubstr("found \"../../escape\""));
}

TEST(CliTest, AnUnevenEvenSplitIsSaid) {
  CliResult result = RunCommand({"config", "check", "--config_only", "--set", "model.n_layer=3",
                                 "--set", "parallel.pp=2", "--set", "parallel.partition=even"});
  EXPECT_EQ(result.status, kExitOk) << result.err;
  EXPECT_THAT(result.err, HasSubstr("warning: parallel.partition = \"even\": 3 blocks do not "
                                    "divide evenly over 2 model chunks, so they are split 2 + 1"));
  EXPECT_THAT(RunCommand({"config", "check", "--config_only", "--set", "model.n_layer=4", "--set",
                          "parallel.pp=2", "--set", "parallel.partition=even"})
                  .err,
              Not(HasSubstr("divide evenly")));
}

// Nothing runs, and nothing is created, on arguments the command cannot take: a config given
// without --config must not train the embedded default into ./runs.
TEST(CliTest, StrayArgumentsAreUsageErrorsAndCreateNothing) {
  const std::string run = testing::TempDir() + "stray_run";
  std::filesystem::remove_all(run);
  const std::string run_dir = "run.dir=\"" + run + "\"";
  CliResult train = RunCommand({"train", "configs/tiny_cpu.toml", "--set", run_dir});
  EXPECT_EQ(train.status, kExitUsage);
  EXPECT_THAT(train.err, HasSubstr("train takes no positional arguments, found "
                                   "'configs/tiny_cpu.toml' (a config goes after --config: "
                                   "--config configs/tiny_cpu.toml)"));
  CliResult study = RunCommand({"study", "--set", run_dir});
  EXPECT_EQ(study.status, kExitUsage);
  EXPECT_THAT(study.err, HasSubstr("study needs --config FILE"));
  // A config a study cannot use is refused before its run directory is made.
  CliResult no_tasks = RunCommand({"study", "--config", "configs/tiny_cpu.toml", "--set", run_dir});
  EXPECT_EQ(no_tasks.status, kExitFailure);
  EXPECT_THAT(no_tasks.err, HasSubstr("a study compares side tasks"));
  CliResult unset = RunCommand({"train", "--set", "train.steps", "--set", run_dir});
  EXPECT_EQ(unset.status, kExitUsage);
  EXPECT_THAT(unset.err, HasSubstr("--set 'train.steps': expected SECTION.KEY=VALUE"));
  EXPECT_FALSE(std::filesystem::exists(run));
  EXPECT_EQ(RunCommand({"config", "check", "a.toml", "b.toml"}).status, kExitUsage);
  EXPECT_EQ(RunCommand({"version", "extra"}).status, kExitUsage);
  EXPECT_EQ(RunCommand({"eval", "--checkpoint", "x", "--data", "y", "z"}).status, kExitUsage);
}

TEST(CliTest, MissingConfigFileIsAClearError) {
  CliResult result = RunCommand({"config", "check", "/nonexistent/run.toml"});
  EXPECT_EQ(result.status, kExitFailure);
  EXPECT_THAT(result.err, HasSubstr("/nonexistent/run.toml: cannot open"));
  EXPECT_THAT(result.err, Not(HasSubstr("[run]")));
}

}  // namespace
}  // namespace freeride
