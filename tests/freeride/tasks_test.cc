// Registry and plugins (each error asserted), and the built-in tasks against independent
// references: PageRank by a plain float64 power iteration, images by their PPM output, the
// `command` task's process state read from /proc.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/device.h"
#include "core/files.h"
#include "core/timer.h"
#include "freeride/executor.h"
#include "freeride/task_host.h"
#include "gtest/gtest.h"
#include "models/backend.h"
#include "models/tokenizer.h"

namespace freeride {
namespace {

std::string TasksTemp(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) / name).string();
}

std::string ErrorOf(const std::string& type, const std::string& plugin) {
  auto task = CreateSideTask(type, plugin);
  return task.ok() ? "" : std::string(task.status().message());
}

TEST(SideTaskRegistryTest, UnknownTypeListsTheBuiltIns) {
  const std::string message = ErrorOf("pagernk", "");
  EXPECT_NE(message.find("unknown side task type 'pagernk'"), std::string::npos) << message;
  EXPECT_NE(message.find("pagerank"), std::string::npos);
  EXPECT_NE(message.find("image"), std::string::npos);
}

TEST(SideTaskRegistryTest, PluginLoadsAndRuns) {
  auto task = CreateSideTask("collatz", FREERIDE_COLLATZ_PLUGIN);
  ASSERT_TRUE(task.ok()) << task.status();
  TaskArgs args{{"chunk", int64_t{1000}}};
  CappedArena arena;
  SideTaskContext ctx{"collatz",           0, 0, &args, &arena, TasksTemp("collatz"), 0,
                      [] { return false; }};
  ASSERT_TRUE((*task)->Create(ctx).ok());
  ASSERT_TRUE((*task)->Step(ctx).ok());
  // Below 1000, 871 has the longest chain: 179 terms (a known result).
  EXPECT_NE((*task)->Summary().find("starts at 871 (179 terms)"), std::string::npos)
      << (*task)->Summary();
}

TEST(SideTaskRegistryTest, PluginErrorsAreClear) {
  EXPECT_NE(ErrorOf("collatz", TasksTemp("missing.so")).find("cannot be loaded"),
            std::string::npos);
  EXPECT_NE(ErrorOf("x", FREERIDE_NO_SYMBOL_PLUGIN)
                .find("lacks the symbol freeride_side_task_abi_version"),
            std::string::npos);
  EXPECT_NE(ErrorOf("x", FREERIDE_WRONG_ABI_PLUGIN)
                .find("built for side-task ABI version 999; this freeride has version " +
                      std::to_string(kSideTaskAbiVersion)),
            std::string::npos);
  EXPECT_NE(ErrorOf("pagerank", FREERIDE_COLLATZ_PLUGIN).find("does not provide type 'pagerank'"),
            std::string::npos);
}

TEST(SideTaskRegistryTest, PluginOfAnotherAbseilAndCompilerIsRefusedNamingBoth) {
  const std::string message = ErrorOf("x", FREERIDE_OTHER_IDENTITY_PLUGIN);
  EXPECT_NE(message.find("was built with abseil 20240116.2 (namespace absl::lts_20240116), "
                         "clang 17 with libc++ 170000; this freeride was built with " +
                         std::string(FREERIDE_SIDE_TASK_BUILD_IDENTITY)),
            std::string::npos)
      << message;
  // This build's own record, as the in-tree plugins carry it.
  EXPECT_NE(std::string(FREERIDE_SIDE_TASK_BUILD_IDENTITY).find("abseil 20"), std::string::npos);
  EXPECT_EQ(std::string(FREERIDE_SIDE_TASK_BUILD_IDENTITY).find("unknown"), std::string::npos);
}

TEST(SideTaskRegistryTest, PluginWithNullIdentityIsRefusedInProcessAndInAWorker) {
  const std::string expected = "freeride_side_task_build_identity() returned null";
  EXPECT_NE(ErrorOf("x", FREERIDE_NULL_IDENTITY_PLUGIN).find(expected), std::string::npos);
  SideTaskSpec spec{"x", "x", FREERIDE_NULL_IDENTITY_PLUGIN, 0, 0, {}};
  spec.isolation = "process";
  HostOptions options;
  options.results_dir = TasksTemp("null_identity");
  auto host = MakeTaskHost(spec, options);
  ASSERT_TRUE(host.ok()) << host.status();
  const absl::Status created = (*host)->Create();
  (*host)->Release();
  // The worker answers with the same refusal (a configuration error), not a crash.
  EXPECT_TRUE(absl::IsInvalidArgument(created)) << created;
  EXPECT_NE(created.message().find(expected), std::string::npos) << created;
}

TEST(SideTaskArgsTest, BadArgumentsNameTaskAndArgument) {
  ExecutorOptions options;
  options.results_dir = TasksTemp("args");
  auto bad = SideTaskExecutor::Create(
      {SideTaskSpec{"pagerank", "pr", "", 0, 0, {{"damping", std::string("high")}}}}, options);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(
                "side task 'pr': args.damping: expected a number in [0, 1], found \"high\""),
            std::string::npos)
      << bad.status().message();
  auto unknown = SideTaskExecutor::Create(
      {SideTaskSpec{"image", "img", "", 0, 0, {{"colour", int64_t{3}}}}}, options);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("unknown argument args.colour"), std::string::npos);
}

// Runs a task alone through its lifecycle until Done (or `max_steps`).
void RunToEnd(SideTask& task, SideTaskContext& ctx, int max_steps) {
  ASSERT_TRUE(task.Create(ctx).ok());
  ASSERT_TRUE(MakeDirectories(ctx.results_dir).ok());
  ASSERT_TRUE(task.Load(ctx).ok());
  for (int i = 0; i < max_steps && !task.Done(); ++i) ASSERT_TRUE(task.Step(ctx).ok());
  ASSERT_TRUE(task.Unload(ctx).ok());
}

// Dense power iteration on `edges` over `n` vertices; teleport and dangling mass go to every
// vertex alike (source < 0) or to `source` alone.
std::vector<double> DensePageRank(const std::vector<std::pair<int, int>>& edges, int n,
                                  int source) {
  std::vector<double> r(n, 1.0 / n), out(n, 0);
  for (auto [u, v] : edges) out[u] += 1;
  for (int it = 0; it < 300; ++it) {
    double dangling = 0;
    for (int v = 0; v < n; ++v) dangling += out[v] == 0 ? r[v] : 0;
    const double mass = (1 - 0.85) + 0.85 * dangling;
    std::vector<double> next(n, source < 0 ? mass / n : 0.0);
    if (source >= 0) next[source] += mass;
    for (auto [u, v] : edges) next[v] += 0.85 * r[u] / out[u];
    r = next;
  }
  return r;
}

void ExpectRanks(const std::string& path, const std::vector<double>& expected) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);  // header
  int v;
  double rank;
  size_t count = 0;
  while (in >> v >> rank) {
    EXPECT_NEAR(rank, expected[v], 1e-9) << "vertex " << v;
    ++count;
  }
  EXPECT_EQ(count, expected.size());
}

TEST(PageRankTaskTest, MatchesPlainPowerIterationThenPersonalizedAfterARestart) {
  // 0→1, 0→2, 1→2, 2→0, 3→2, and 4 dangling (no out-edges) but pointed at by 3.
  const std::vector<std::pair<int, int>> edges{{0, 1}, {0, 2}, {1, 2}, {2, 0}, {3, 2}, {3, 4}};
  std::string text = "# a small graph\n";
  for (auto [u, v] : edges) text += std::to_string(u) + " " + std::to_string(v) + "\n";
  ASSERT_TRUE(WriteFileAtomically(TasksTemp("graph.txt"), text).ok());
  auto task = CreateSideTask("pagerank", "");
  ASSERT_TRUE(task.ok());
  TaskArgs args{{"edges", TasksTemp("graph.txt")},
                {"tolerance", 1e-12},
                {"rows_per_step", int64_t{2}},
                {"seed", int64_t{7}}};
  CappedArena arena;
  SideTaskContext ctx{"pr", 0, 0, &args, &arena, TasksTemp("pr"), 0, [] { return false; }};
  RunToEnd(**task, ctx, 100000);
  EXPECT_TRUE((*task)->Done());
  ExpectRanks(TasksTemp("pr") + "/ranks.txt", DensePageRank(edges, 5, -1));
  // The second query: personalized to vertex (7 + 1) mod 5 = 3, on the same graph.
  ASSERT_TRUE((*task)->Load(ctx).ok());
  ctx.restarts = 1;
  ASSERT_TRUE((*task)->Restart(ctx).ok());
  EXPECT_FALSE((*task)->Done());
  for (int i = 0; i < 100000 && !(*task)->Done(); ++i) ASSERT_TRUE((*task)->Step(ctx).ok());
  ASSERT_TRUE((*task)->Unload(ctx).ok());
  ExpectRanks(TasksTemp("pr") + "/ranks.txt", DensePageRank(edges, 5, 3));
}

TEST(ImageTaskTest, WritesWatermarkedImages) {
  auto task = CreateSideTask("image", "");
  ASSERT_TRUE(task.ok());
  TaskArgs args{{"width", int64_t{64}}, {"height", int64_t{48}}, {"out_width", int64_t{40}},
                {"out_height", int64_t{30}}, {"count", int64_t{3}}, {"write_every", int64_t{1}}};
  CappedArena arena(1 << 20);
  SideTaskContext ctx{"img", 0, 0, &args, &arena, TasksTemp("img"), 0, [] { return false; }};
  RunToEnd(**task, ctx, 10);
  EXPECT_TRUE((*task)->Done());
  auto ppm = ReadFile(TasksTemp("img") + "/image_000003.ppm");
  ASSERT_TRUE(ppm.ok());
  EXPECT_EQ(ppm->substr(0, 13), "P6\n40 30\n255\n");
  EXPECT_EQ(ppm->size(), 13u + 40 * 30 * 3);
}

// A restart gives the task its next input: the image pipeline's second start makes images 3
// and 4, not 1 and 2 again.
TEST(ImageTaskTest, ARestartTakesTheNextImages) {
  SideTaskSpec spec{"image", "img_repeat", "", 0, 1 << 20,
                    {{"width", int64_t{16}}, {"height", int64_t{16}}, {"out_width", int64_t{8}},
                     {"out_height", int64_t{8}}, {"count", int64_t{2}},
                     {"write_every", int64_t{1}}}};
  spec.repeat = true;
  HostOptions options;
  options.results_dir = TasksTemp("img_repeat");
  ASSERT_TRUE(MakeDirectories(options.results_dir).ok());
  auto host = MakeInProcessHost(spec, options);
  ASSERT_TRUE(host.ok()) << host.status();
  ASSERT_TRUE((*host)->Create().ok());
  ASSERT_TRUE((*host)->Load().ok());
  std::vector<bool> restarted;
  for (int i = 0; i < 4; ++i) {
    const HostStep out = (*host)->Step(MonotonicSeconds() + 1, [] { return false; });
    ASSERT_EQ(out.kind, HostStep::Kind::kDone) << out.reason;
    EXPECT_FALSE(out.finished);  // a repeating task never finishes
    restarted.push_back(out.restarted);
  }
  EXPECT_EQ(restarted, (std::vector<bool>{false, false, true, false}));
  for (int n = 1; n <= 4; ++n) {
    EXPECT_TRUE(
        std::filesystem::exists(absl::StrFormat("%s/image_%06d.ppm", TasksTemp("img_repeat"), n)))
        << n;
  }
}

char ProcessState(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string all((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = all.rfind(')');
  return paren == std::string::npos || paren + 2 >= all.size() ? '?' : all[paren + 2];
}

TEST(CommandTaskTest, RunsOnlyInsideBubbles) {
  auto task = CreateSideTask("command", "");
  ASSERT_TRUE(task.ok());
  // The child records its pid, then sleeps: stopped outside bubbles, sleeping inside. The pid
  // as this process sees it: `$$` may be a PID namespace's, /proc is the machine's (cut's
  // parent in its /proc/self/stat).
  TaskArgs args{{"argv", std::vector<std::string>{
                             "sh", "-c", "cut -d' ' -f4 /proc/self/stat > pid; exec sleep 60"}}};
  CappedArena arena;
  SideTaskContext ctx{"cmd", 0, 0, &args, &arena, TasksTemp("cmd"), 0, [] { return false; }};
  std::filesystem::remove_all(ctx.results_dir);
  ASSERT_TRUE(MakeDirectories(ctx.results_dir).ok());
  ASSERT_TRUE((*task)->Create(ctx).ok());
  ASSERT_TRUE((*task)->Load(ctx).ok());
  // Bubbles of 100 ms until the child has written its pid (the first, unless the machine is
  // loaded enough to hold a shell's start past it).
  // The redirection creates the file before echo writes the line: the line is what counts.
  absl::StatusOr<std::string> pid_text = absl::NotFoundError("no bubble yet");
  auto written = [&] { return pid_text.ok() && absl::EndsWith(*pid_text, "\n"); };
  for (int bubble = 0; bubble < 600 && !written(); ++bubble) {
    ctx.deadline_s = MonotonicSeconds() + 0.1;
    ASSERT_TRUE((*task)->Step(ctx).ok());
    pid_text = ReadFile(ctx.results_dir + "/pid");
  }
  ASSERT_TRUE(written()) << "the child never ran inside a bubble";
  const int pid = std::stoi(*pid_text);
  // The step returns once the supervisor has stopped; the program, sent the same SIGSTOP, stops
  // as soon as it is next scheduled, which a loaded machine may delay: waited for, up to 10 s.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (ProcessState(pid) != 'T' && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(ProcessState(pid), 'T') << "outside a bubble the command must be stopped";
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(ProcessState(pid), 'T');
  ASSERT_TRUE((*task)->Unload(ctx).ok());  // the end of training: killed
  EXPECT_FALSE((*task)->Done());
}

TEST(CommandTaskTest, CrashIsAnErrorWithTheStatus) {
  auto task = CreateSideTask("command", "");
  TaskArgs args{{"argv", std::vector<std::string>{"sh", "-c", "exit 3"}}};
  CappedArena arena;
  SideTaskContext ctx{"crash", 0, 0, &args, &arena, TasksTemp("crash"), 0, [] { return false; }};
  ASSERT_TRUE(MakeDirectories(ctx.results_dir).ok());
  ASSERT_TRUE((*task)->Create(ctx).ok());
  ASSERT_TRUE((*task)->Load(ctx).ok());
  ctx.deadline_s = MonotonicSeconds() + 600;  // the step returns as soon as the child ends
  auto step = (*task)->Step(ctx);
  ASSERT_FALSE(step.ok());
  EXPECT_NE(step.status().message().find("exited with status 3"), std::string::npos);
}

}  // namespace
}  // namespace freeride

namespace freeride {
namespace {

TEST(TrainTaskTest, LossFalls) {
  auto task = CreateSideTask("train", "");
  ASSERT_TRUE(task.ok());
  TaskArgs args{{"steps", int64_t{80}}, {"n_embd", int64_t{32}}, {"vocab", int64_t{32}},
                {"seq_len", int64_t{16}}, {"lr", 1e-2}};
  CappedArena arena(64 << 20);
  SideTaskContext ctx{"train", 0, 0, &args, &arena, TasksTemp("train"), 0, [] { return false; }};
  RunToEnd(**task, ctx, 1000);
  EXPECT_TRUE((*task)->Done());
  double first = 0, last = 0;
  ASSERT_EQ(std::sscanf((*task)->Summary().c_str(), "80 steps, loss %lf -> %lf", &first, &last), 2)
      << (*task)->Summary();
  EXPECT_NEAR(first, std::log(32.0), 0.3);
  EXPECT_LT(last, first - 1.0);
}

TEST(TrainTaskTest, DeviceArgumentsAreCheckedAndAMissingGpuIsAClearLoadError) {
  CappedArena arena(64 << 20);
  auto error_at = [&](const TaskArgs& args, bool load) -> std::string {
    auto task = CreateSideTask("train", "");
    EXPECT_TRUE(task.ok());
    SideTaskContext ctx{"t", 0, 0, &args, &arena, TasksTemp("train_dev"), 0, [] { return false; }};
    absl::Status s = (*task)->Create(ctx);
    if (s.ok() && load) s = (*task)->Load(ctx);
    return std::string(s.message());
  };
  EXPECT_NE(error_at({{"device", std::string("tpu")}}, false)
                .find("args.device: expected one of \"cpu\", \"cuda\", found \"tpu\""),
            std::string::npos);
  EXPECT_NE(error_at({{"precision", std::string("bf16")}}, false).find("needs device = \"cuda\""),
            std::string::npos);
  if (CudaBackendBuilt() && !DiscoverDevices().cuda.empty()) return;  // the GPU suite runs it
  const std::string message = error_at({{"device", std::string("cuda")}}, true);
  EXPECT_NE(message.find("cuda"), std::string::npos) << message;
}

TEST(GptInferTaskTest, GeneratesBatchesFromACheckpoint) {
  auto task = CreateSideTask("gpt_infer", "");
  ASSERT_TRUE(task.ok());
  TaskArgs args{{"checkpoint", std::string("tests/data/gpt2_golden/model.bin")},
                {"batch", int64_t{2}}, {"max_tokens", int64_t{5}}, {"requests", int64_t{4}}};
  CappedArena arena(16 << 20);
  SideTaskContext ctx{"infer", 0, 0, &args, &arena, TasksTemp("infer"), 0, [] { return false; }};
  std::filesystem::remove_all(ctx.results_dir);
  RunToEnd(**task, ctx, 100);
  EXPECT_TRUE((*task)->Done());
  auto text = ReadFile(ctx.results_dir + "/generations.txt");
  ASSERT_TRUE(text.ok());
  std::istringstream lines(*text);
  std::string line;
  int count = 0;
  while (std::getline(lines, line)) {
    std::istringstream ids(line);
    int id, n = 0;
    while (ids >> id) {
      EXPECT_TRUE(id >= 0 && id < 100) << id;
      ++n;
    }
    EXPECT_EQ(n, 5);
    ++count;
  }
  EXPECT_EQ(count, 4);
  // Beside the ids, each sequence decoded by the GPT-2 tokenizer (run from the repository
  // root, where data/r50k_base.tiktoken is).
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Load(kDefaultTokenizerPath);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto jsonl = ReadFile(ctx.results_dir + "/generations.jsonl");
  ASSERT_TRUE(jsonl.ok());
  std::istringstream records(*jsonl), id_lines(*text);
  int decoded = 0;
  while (std::getline(records, line)) {
    const nlohmann::json record = nlohmann::json::parse(line);
    std::string ids_line;
    ASSERT_TRUE(std::getline(id_lines, ids_line));
    std::vector<int32_t> ids;
    std::istringstream in(ids_line);
    for (int id; in >> id;) ids.push_back(id);
    EXPECT_EQ(record["sequence"], decoded);
    EXPECT_EQ(record["tokens"].get<std::vector<int32_t>>(), ids);
    EXPECT_EQ(record["text"], *(*tokenizer)->Decode(ids));
    ++decoded;
  }
  EXPECT_EQ(decoded, 4);
  // A tokenizer named that cannot be read stops the task at Create, with the path.
  TaskArgs bad = args;
  bad["tokenizer"] = std::string("no/such/ranks.tiktoken");
  auto refused = CreateSideTask("gpt_infer", "");
  SideTaskContext ctx3{"infer", 0, 0, &bad, &arena, TasksTemp("infer3"), 0, [] { return false; }};
  absl::Status created = (*refused)->Create(ctx3);
  ASSERT_FALSE(created.ok());
  EXPECT_NE(created.message().find("no/such/ranks.tiktoken"), std::string::npos);
  // The weights alone (about 120 KB) do not fit a 64 KiB limit.
  auto small = CreateSideTask("gpt_infer", "");
  CappedArena tiny(64 << 10);
  SideTaskContext ctx2{"infer", 0, 0, &args, &tiny, TasksTemp("infer2"), 0, [] { return false; }};
  ASSERT_TRUE((*small)->Create(ctx2).ok());
  absl::Status load = (*small)->Load(ctx2);
  ASSERT_FALSE(load.ok());
  EXPECT_NE(load.message().find("gpt_infer weights"), std::string::npos);
  EXPECT_NE(load.message().find("exceeds the memory limit"), std::string::npos);
}

// Sampled generations of `engine` from the golden checkpoint, with a fixed seed: the same
// logits give the same tokens, and the sequences differ from one another.
std::string Generations(const std::string& engine, const std::string& dir) {
  auto task = CreateSideTask("gpt_infer", "");
  EXPECT_TRUE(task.ok());
  TaskArgs args{{"checkpoint", std::string("tests/data/gpt2_golden/model.bin")},
                {"batch", int64_t{3}},       {"max_tokens", int64_t{7}},
                {"requests", int64_t{6}},    {"temperature", 1.0},
                {"top_k", int64_t{0}},       {"seed", int64_t{5}},
                {"engine", engine}};
  CappedArena arena(64 << 20);
  SideTaskContext ctx{"infer", 0, 0, &args, &arena, TasksTemp(dir), 0, [] { return false; }};
  std::filesystem::remove_all(ctx.results_dir);
  RunToEnd(**task, ctx, 100);
  EXPECT_TRUE((*task)->Done());
  auto text = ReadFile(ctx.results_dir + "/generations.txt");
  EXPECT_TRUE(text.ok());
  return text.ok() ? *text : "";
}

// The recompute engine (any backend's model over the whole window) against the key/value
// cache decoder: the same tokens, so its windowing and position reads are right.
TEST(GptInferTaskTest, RecomputeEngineGeneratesWhatTheKvCacheDoes) {
  const std::string cached = Generations("kv_cache", "infer_kv");
  const std::string recomputed = Generations("recompute", "infer_recompute");
  std::vector<std::string> lines = absl::StrSplit(cached, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_NE(lines[0], lines[1]);  // sampled, so the sequences tell positions apart
  EXPECT_EQ(recomputed, cached);
}

TEST(GptInferTaskTest, KvCacheEngineIsRefusedOnAGpu) {
  if (!CudaBackendBuilt()) GTEST_SKIP() << "no CUDA backend in this build";
  auto task = CreateSideTask("gpt_infer", "");
  ASSERT_TRUE(task.ok());
  TaskArgs args{{"checkpoint", std::string("tests/data/gpt2_golden/model.bin")},
                {"engine", std::string("kv_cache")}, {"device", std::string("cuda")}};
  CappedArena arena;
  SideTaskContext ctx{
      "infer", 0, 0, &args, &arena, TasksTemp("infer_gpu"), 0, [] { return false; }};
  absl::Status s = (*task)->Create(ctx);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("use engine = \"recompute\""), std::string::npos) << s;
}

}  // namespace
}  // namespace freeride
