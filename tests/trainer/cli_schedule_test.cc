// The schedule, simulate and project commands: what they print, the cost files and link
// models they read, and their refusals.
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/trainer/run_cli.h"

namespace freeride {
namespace {

using testing::HasSubstr;

TEST(CliScheduleTest, PrintsAScheduleThatParsesBack) {
  CliResult result = RunCommand({"schedule", "--kind", "1f1b", "--stages", "2",
                                 "--microbatches", "3"});
  EXPECT_EQ(result.status, kExitOk) << result.err;
  EXPECT_THAT(result.out, HasSubstr("stage1: LOAD0 BUBBLE(warmup,1ms) RECV_F0 F0"));
  const std::string path = WriteTemp("sched.txt", result.out);
  CliResult again = RunCommand({"schedule", "--input", path});
  EXPECT_EQ(again.status, kExitOk) << again.err;
  EXPECT_EQ(again.out, result.out);
}

TEST(CliScheduleTest, SimulateJsonHasTheDocumentedKeys) {
  CliResult result = RunCommand({"simulate", "--kind", "gpipe", "--stages", "4",
                                 "--microbatches", "4", "--format", "json"});
  EXPECT_EQ(result.status, kExitOk) << result.err;
  for (const char* key : {"\"kind\":\"gpipe\"", "\"stages\":4", "\"microbatches\":4",
                          "\"chunks\":1", "\"step_time\":", "\"bubble_fraction\":0.428571",
                          "\"per_stage\":[{\"stage\":0,\"busy\":", "\"bubbles\":[{\"kind\":"}) {
    EXPECT_THAT(result.out, HasSubstr(key));
  }
}

TEST(CliScheduleTest, PicturesAndCostFile) {
  const std::string costs = WriteTemp("costs.toml", "f = [1.0, 2.0]\nb = 1\ncomm = 0.5\n");
  CliResult svg = RunCommand({"schedule", "--stages", "2", "--microbatches", "2",
                              "--cost-file", costs, "--format", "svg"});
  EXPECT_EQ(svg.status, kExitOk) << svg.err;
  EXPECT_THAT(svg.out, HasSubstr("<svg"));
  EXPECT_THAT(svg.out, HasSubstr("cooldown"));
  CliResult trace = RunCommand({"schedule", "--stages", "2", "--microbatches", "2",
                                "--format", "chrome"});
  EXPECT_THAT(trace.out, HasSubstr("\"traceEvents\""));
  EXPECT_THAT(trace.out, HasSubstr("\"cat\":\"bubble\""));
  const std::string bad = WriteTemp("bad_costs.toml", "f = [1.0]\n");
  CliResult error = RunCommand({"simulate", "--stages", "2", "--cost-file", bad});
  EXPECT_EQ(error.status, kExitFailure);
  EXPECT_THAT(error.err, HasSubstr("bad_costs.toml:1: f: expected 2 values"));
}

TEST(CliScheduleTest, ConfigShowsTheSplitAndTorchFormatRoundTrips) {
  const std::string config = WriteTemp(
      "split.toml",
      "[data]\ntrain = \"x\"\n[model]\nn_layer = 12\nn_head = 12\nn_embd = 768\n"
      "max_seq_len = 1024\n[train]\nbatch_size = 8\nseq_len = 1024\nmicrobatches = 8\n"
      "[parallel]\npp = 4\nschedule = \"zbv\"\n");
  CliResult sim = RunCommand({"simulate", "--config", config});
  EXPECT_EQ(sim.status, kExitOk) << sim.err;
  // GPT-2 124M in a V over 4 stages: stage 0 holds the embedding and the head.
  EXPECT_THAT(sim.out, HasSubstr("split balanced by the FLOP model (head = 4.47 blocks"));
  EXPECT_THAT(sim.out, HasSubstr("+embedding"));
  EXPECT_THAT(sim.out, HasSubstr("zbv: p=4 m=8 v=2"));
  CliResult mixed = RunCommand({"simulate", "--config", config, "--kind", "1f1b"});
  EXPECT_EQ(mixed.status, kExitUsage);
  EXPECT_THAT(mixed.err, HasSubstr("--kind comes from the training config"));
  CliResult torch = RunCommand({"schedule", "--kind", "dualpipev", "--stages", "2",
                                "--microbatches", "4", "--format", "torch"});
  EXPECT_EQ(torch.status, kExitOk) << torch.err;
  EXPECT_THAT(torch.out, HasSubstr("0F0,"));
  const std::string path = WriteTemp("dual.csv", torch.out);
  CliResult back = RunCommand({"schedule", "--input", path, "--format", "torch"});
  EXPECT_EQ(back.status, kExitOk) << back.err;
  EXPECT_EQ(back.out, torch.out);
}

TEST(CliScheduleTest, BadInputsAreClearErrors) {
  CliResult kind = RunCommand({"simulate", "--kind", "pipedream"});
  EXPECT_EQ(kind.status, kExitUsage);
  EXPECT_THAT(kind.err, HasSubstr("unknown schedule kind 'pipedream'"));
  CliResult refused = RunCommand({"simulate", "--kind", "interleaved", "--stages", "4",
                                  "--microbatches", "6", "--chunks", "2"});
  EXPECT_THAT(refused.err, HasSubstr("Try m=4 or m=8"));
  const std::string broken = WriteTemp("broken_sched.txt", "stage0: F0 B1 F1 B0\n");
  CliResult invalid = RunCommand({"simulate", "--input", broken});
  EXPECT_EQ(invalid.status, kExitFailure);
  EXPECT_THAT(invalid.err, HasSubstr("rule 'order'"));
}

// Flags that cannot be read are bad usage (2), as documented; a schedule that cannot be built
// from readable flags is the work failing (1, above).
TEST(CliScheduleTest, UnreadableFlagsAreUsageErrors) {
  for (const auto& [args, words] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"schedule", "--kind", "bogus"}, "unknown schedule kind 'bogus'"},
           {{"schedule", "--stages", "0"}, "--stages: expected an integer >= 1, found '0'"},
           {{"schedule", "--microbatches", "abc"}, "--microbatches: expected an integer >= 1"},
           {{"schedule", "--format", "bogus"}, "--format: expected text, csv"},
           {{"simulate", "--cost", "f=abc"}, "--cost 'f=abc': expected key=milliseconds"},
           {{"simulate", "--cost", "f=1", "--cost-file", "c.toml"}, "not both"},
           {{"simulate", "--config", "configs/tiny_cpu.toml", "--stages", "2"},
            "--stages comes from the training config"},
           {{"simulate", "--transport", "gloo"}, "--transport: expected nccl or mpi, found 'gloo'"},
           {{"simulate", "--fabric", "pcie"}, "--fabric: expected nvlink or ib, found 'pcie'"},
           {{"simulate", "--transport", "mpi", "--fabric", "nvlink"}, "--transport mpi --fabric"},
           {{"simulate", "--transport", "nccl"}, "--transport needs --message-bytes N"},
           {{"simulate", "--fabric", "ib", "--message-bytes", "0"}, "--message-bytes: expected"},
           {{"simulate", "--message-bytes", "8"}, "--message-bytes sizes the link of --transport"},
           {{"simulate", "--transport", "nccl", "--message-bytes", "8", "--cost", "f=1, comm=0"},
            "--cost comm= and --transport both give the message time"}}) {
    CliResult result = RunCommand(args);
    EXPECT_EQ(result.status, kExitUsage) << absl::StrJoin(args, " ") << "\n" << result.err;
    EXPECT_THAT(result.err, HasSubstr(words));
  }
}

// The simulator's comm is one message over the transport's link model: α + bytes/β, and for MPI
// the two staged PCIe copies, 2·(α_s + bytes/β_s); the same step as that comm given outright.
TEST(CliScheduleTest, CommComesFromTheTransportsLinkModel) {
  const double mib = 1 << 20;
  for (const auto& [transport, fabric, comm] :
       std::vector<std::tuple<const char*, const char*, double>>{
           {"nccl", "nvlink", 3.4e-3 + mib * 1e3 / 450e9},
           {"mpi", "ib", 9.6e-3 + mib * 1e3 / 50e9 + 2 * (10e-3 + mib * 1e3 / 63e9)}}) {
    const std::vector<std::string> base = {"simulate",       "--kind", "gpipe",    "--stages", "2",
                                           "--microbatches", "2",      "--format", "json"};
    std::vector<std::string> linked = base;
    linked.insert(linked.end(), {"--transport", transport, "--fabric", fabric, "--message-bytes",
                                 "1048576", "--cost", "f=0.01,b=0.01,w=0"});
    CliResult link = RunCommand(linked);
    ASSERT_EQ(link.status, kExitOk) << link.err;
    EXPECT_THAT(link.err, HasSubstr(absl::StrFormat("comm %.6g ms", comm)));
    std::vector<std::string> given = base;
    given.insert(given.end(), {"--cost", absl::StrFormat("f=0.01,b=0.01,w=0,comm=%.17g", comm)});
    EXPECT_EQ(link.out, RunCommand(given).out) << transport;
  }
  // With --config, a message is one micro-batch's activations: 2 × 64 × 128 fp32 values.
  CliResult config =
      RunCommand({"simulate", "--config", "configs/tiny_cpu_pp2.toml", "--fabric", "nvlink"});
  ASSERT_EQ(config.status, kExitOk) << config.err;
  EXPECT_THAT(config.out, HasSubstr("link: NCCL over NVLink 4"));
  EXPECT_THAT(config.out, HasSubstr(absl::StrFormat("65536-byte messages: comm %.6g ms",
                                                    3.4e-3 + 65536 * 1e3 / 450e9)));
  const std::string costs = WriteTemp("comm_costs.toml", "comm = 0.5\n");
  CliResult file = RunCommand({"simulate", "--stages", "2", "--cost-file", costs, "--transport",
                               "nccl", "--message-bytes", "8"});
  EXPECT_THAT(file.err, HasSubstr("comm_costs.toml:1: comm: comm is given by --transport"));
}

// A cost file's byte counts are whole numbers: a float is refused by name, never cast (a float
// past int64_t's range made the cast undefined, as fuzz_worker_spec found for the worker spec).
TEST(CliSimulateTest, ACostFilesBytesMustBeWhole) {
  for (const char* bytes : {"1e69", "12.5", "-3"}) {
    const std::string costs =
        WriteTemp("byte_costs.toml", absl::StrCat("f = 1.0\nmemory_total = ", bytes, "\n"));
    CliResult r = RunCommand({"simulate", "--stages", "2", "--cost-file", costs});
    EXPECT_EQ(r.status, kExitFailure) << bytes;
    EXPECT_THAT(r.err, HasSubstr("byte_costs.toml:2: memory_total: expected whole bytes >= 0"))
        << bytes;
  }
}

// --transport and --fabric take the transport's link model (pipeline/link_model.h), named in
// the header; the config's transport by default (auto on the CPU: MPI, which NVLink does not
// carry: refused naming both flags); a figure given outright still wins.
TEST(CliProjectTest, TakesTheLinkModelOfTheTransport) {
  const std::vector<std::string> base = {
      "project", "--config", "configs/tiny_cpu_pp2.toml", "--gpus", "4", "--costs", "block=2"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), base.begin(), base.end());
    return RunCommand(more);
  };
  CliResult mpi = with({"--fabric", "ib"});
  ASSERT_EQ(mpi.status, kExitOk) << mpi.err;
  EXPECT_THAT(mpi.out, HasSubstr("stage link 9.6 µs + 50 GB/s"));
  EXPECT_THAT(mpi.out, HasSubstr("Links: MPI over InfiniBand NDR (50 GB/s, 9.6 µs a step), "
                                 "staged through host memory over PCIe 5.0"));
  CliResult nccl = with({"--transport", "nccl", "--fabric", "nvlink", "--link_gbs", "300"});
  ASSERT_EQ(nccl.status, kExitOk) << nccl.err;
  EXPECT_THAT(nccl.out, HasSubstr("stage link 3.4 µs + 300 GB/s"));
  EXPECT_THAT(nccl.out, HasSubstr("all-reduce 3.4 µs + 450 GB/s"));
  CliResult refused = with({"--fabric", "nvlink"});
  EXPECT_EQ(refused.status, kExitUsage);
  EXPECT_THAT(refused.err, HasSubstr("--transport mpi --fabric nvlink"));
}

TEST(CliProjectTest, ProjectsEveryFittingLayoutAndRefusesBadFlags) {
  CliResult md = RunCommand({"project", "--config", "configs/tiny_cpu_pp2.toml", "--gpus", "2,4",
                             "--global_batch", "8", "--micro_batch", "1", "--costs",
                             "embedding=0.1,block=2,head=4", "--kinds", "1f1b,gpipe"});
  ASSERT_EQ(md.status, kExitOk) << md.err;
  EXPECT_THAT(md.out, HasSubstr("| 4 | 1f1b | "));
  EXPECT_THAT(md.out, HasSubstr("| 2 | gpipe | "));
  CliResult json = RunCommand({"project", "--config", "configs/tiny_cpu_pp2.toml", "--gpus", "4",
                               "--costs", "block=2", "--format", "json"});
  ASSERT_EQ(json.status, kExitOk) << json.err;
  EXPECT_THAT(json.out, HasSubstr("\"reclaimed_gpus\": "));
  EXPECT_THAT(json.out, HasSubstr("\"bubble_by_kind\": {"));
  CliResult gpus = RunCommand({"project", "--config", "configs/tiny_cpu_pp2.toml", "--gpus", "0"});
  EXPECT_EQ(gpus.status, kExitUsage);
  EXPECT_THAT(gpus.err, HasSubstr("--gpus: expected GPU counts >= 1"));
  CliResult costs = RunCommand({"project", "--config", "configs/tiny_cpu_pp2.toml", "--gpus", "2",
                                "--costs", "mlp=3"});
  EXPECT_EQ(costs.status, kExitUsage);
  EXPECT_THAT(costs.err, HasSubstr("unknown part 'mlp'"));
  CliResult flops = RunCommand({"project", "--config", "configs/tiny_cpu_pp2.toml", "--gpus", "2",
                                "--costs", "flops"});
  EXPECT_THAT(flops.err, HasSubstr("--costs flops needs --tflops"));
  // The data-parallel buckets default to the config's parallel.dp_bucket_mb.
  CliResult buckets =
      RunCommand({"project", "--config", "configs/tiny_cpu_pp2.toml", "--gpus", "4", "--costs",
                  "block=2", "--set", "parallel.dp_bucket_mb=4"});
  ASSERT_EQ(buckets.status, kExitOk) << buckets.err;
  EXPECT_THAT(buckets.out, HasSubstr("in 4 MiB buckets overlapping the last backward"));
}

TEST(CliProjectTest, ASideTaskThatCannotRunHereIsGivenItsStepTime) {
  const std::string config = WriteTemp(
      "project_tasks.toml",
      "[model]\nn_layer = 4\nn_head = 2\nn_embd = 32\nmax_seq_len = 64\nvocab_size = 64\n"
      "[data]\ntrain = \"unused_*.bin\"\n[train]\nbatch_size = 8\nseq_len = 16\nmicrobatches = 8\n"
      "[freeride]\nenabled = true\n"
      "[[side_tasks]]\ntype = \"train\"\nname = \"gpu_train\"\n[side_tasks.args]\n"
      "device = \"cuda\"\n[[side_tasks]]\ntype = \"spin\"\npriority = 1\n"
      "[side_tasks.args]\nstep_ms = 1.0\n");
  const std::vector<std::string> base = {"project", "--config", config, "--gpus", "2",
                                         "--costs", "block=2"};
  CliResult measured = RunCommand(base);
  if (measured.status != kExitOk) {  // no GPU here: the error says what to do
    EXPECT_THAT(measured.err, HasSubstr("--task_ms NAME=MS"));
  }
  std::vector<std::string> given = base;
  given.insert(given.end(), {"--task_ms", "gpu_train=4"});
  CliResult md = RunCommand(given);
  ASSERT_EQ(md.status, kExitOk) << md.err;
  // The executor's order: spin (priority 1) before the given task.
  EXPECT_THAT(md.out, HasSubstr("side tasks: spin ("));
  EXPECT_THAT(md.out, HasSubstr("gpu_train (4 ms steps)"));
  given.back() = "gpu_trian=4";
  CliResult typo = RunCommand(given);
  EXPECT_EQ(typo.status, kExitUsage);
  EXPECT_THAT(typo.err, HasSubstr("no side task named 'gpu_trian'; the config has: gpu_train, spin"));
}

}  // namespace
}  // namespace freeride
