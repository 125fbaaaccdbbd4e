#include "trainer/cli/cmd_project.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/status.h"
#include "freeride/executor.h"
#include "pipeline/link_model.h"
#include "trainer/cli/cli.h"
#include "trainer/config/config.h"
#include "trainer/config/side_task_check.h"
#include "trainer/emulation.h"
#include "trainer/study/projection.h"
#include "trainer/study/projection_memory.h"
#include "trainer/trainer.h"

namespace freeride {
namespace {

absl::StatusOr<std::vector<int64_t>> GpuCounts(const std::string& list) {
  std::vector<int64_t> gpus;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpus: expected GPU counts >= 1 separated by commas, found '", part, "'"));
    }
    gpus.push_back(n);
  }
  if (gpus.empty()) return absl::InvalidArgumentError("--gpus: no GPU count given");
  return gpus;
}

absl::StatusOr<std::vector<pipeline::ScheduleKind>> Kinds(const std::string& list) {
  if (list == "all") {
    return std::vector<pipeline::ScheduleKind>{
        pipeline::ScheduleKind::kGPipe,       pipeline::ScheduleKind::k1F1B,
        pipeline::ScheduleKind::kInterleaved, pipeline::ScheduleKind::kZBH1,
        pipeline::ScheduleKind::kZBH2,        pipeline::ScheduleKind::kZBV,
        pipeline::ScheduleKind::kDualPipeV};
  }
  std::vector<pipeline::ScheduleKind> kinds;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    absl::StatusOr<pipeline::ScheduleKind> kind = pipeline::ParseScheduleKind(part);
    if (!kind.ok() || *kind == pipeline::ScheduleKind::kCustom) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kinds: expected \"all\" or generated kinds (gpipe, 1f1b, interleaved, zbh1, zbh2, "
          "zbv, dualpipev) separated by commas, found '",
          part, "'"));
    }
    kinds.push_back(*kind);
  }
  return kinds;
}

// --costs embedding=0.5,block=2,head=4 (ms per micro-batch, F + B + W).
absl::StatusOr<PartCosts> GivenCosts(const ParsedFlags& flags) {
  FR_ASSIGN_OR_RETURN(const auto parts, NamedNumbersFlag(flags, "costs"));
  PartCosts costs;
  for (const auto& [part, ms] : parts) {
    if (part == "embedding") {
      costs.embedding = ms;
    } else if (part == "block") {
      costs.block = ms;
    } else if (part == "head") {
      costs.head = ms;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--costs: unknown part '", part, "' (expected embedding, block, head)"));
    }
  }
  if (costs.block <= 0) {
    return absl::InvalidArgumentError("--costs: give block=ms > 0 (and embedding=, head=)");
  }
  return costs;
}

// --task_ms NAME=MS[,NAME=MS...]: side tasks whose step time is given rather than measured.
absl::StatusOr<std::map<std::string, double>> GivenTaskTimes(const ParsedFlags& flags,
                                                             const Config& config) {
  FR_ASSIGN_OR_RETURN(const auto items, NamedNumbersFlag(flags, "task_ms"));
  std::map<std::string, double> given;
  for (const auto& [task, ms] : items) {
    if (!(ms > 0)) return absl::InvalidArgumentError("--task_ms: step times must be > 0");
    const bool known = std::any_of(config.side_tasks.begin(), config.side_tasks.end(),
                                   [&](const SideTaskConfig& t) { return t.name == task; });
    if (!known) {
      std::vector<std::string> names;
      for (const SideTaskConfig& t : config.side_tasks) names.push_back(t.name);
      return absl::InvalidArgumentError(
          absl::StrCat("--task_ms: no side task named '", task,
                       "'; the config has: ", absl::StrJoin(names, ", ")));
    }
    given[task] = ms;
  }
  return given;
}

// The step time alone of each task in `specs`, by name, as the executor calibrates it here.
absl::StatusOr<std::map<std::string, ProjectedTask>> CalibrateTasks(
    const std::vector<SideTaskSpec>& specs, const Config& config) {
  ExecutorOptions options;
  options.calibration_steps = static_cast<int>(config.freeride.calibration_steps);
  options.step_timeout_s = config.freeride.step_timeout_s;
  options.results_dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("freeride_project_", getpid()))
          .string();
  constexpr const char* kHint =
      "; a task that cannot run here can be given as --task_ms NAME=MS (its step time alone "
      "where it would run)";
  absl::StatusOr<std::map<std::string, ProjectedTask>> result =
      [&]() -> absl::StatusOr<std::map<std::string, ProjectedTask>> {
    absl::StatusOr<std::unique_ptr<SideTaskExecutor>> executor =
        SideTaskExecutor::Create(specs, options);
    if (!executor.ok()) {
      return absl::Status(executor.status().code(),
                          absl::StrCat(executor.status().message(), kHint));
    }
    (*executor)->Finish();
    std::map<std::string, ProjectedTask> by_name;
    for (const TaskReport& t : (*executor)->Report().tasks) {
      if (t.state == "FAILED") {  // e.g. a CUDA build on a machine without a GPU: at load
        return absl::InternalError(absl::StrCat("side task '", t.name, "': ", t.reason, kHint));
      }
      by_name[t.name] = {t.name, 1e3 * t.standalone_step_s, t.isolation == "process"};
    }
    return by_name;
  }();
  std::error_code ec;
  std::filesystem::remove_all(options.results_dir, ec);
  return result;
}

// Each configured side task's step time alone: as given (--task_ms), else calibrated here; in
// the order the executor offers bubbles (higher priority first, then the config's order).
absl::StatusOr<std::vector<ProjectedTask>> MeasureTasks(
    const Config& config, const std::map<std::string, double>& given) {
  std::vector<ProjectedTask> tasks;
  if (!config.freeride.enabled || config.side_tasks.empty()) return tasks;
  std::vector<SideTaskSpec> specs;
  for (const SideTaskConfig& task : config.side_tasks) {
    if (!given.count(task.name)) specs.push_back(SpecOf(task));
  }
  std::map<std::string, ProjectedTask> by_name;
  if (!specs.empty()) {
    FR_ASSIGN_OR_RETURN(by_name, CalibrateTasks(specs, config));
  }
  std::vector<const SideTaskConfig*> order;
  for (const SideTaskConfig& task : config.side_tasks) order.push_back(&task);
  std::stable_sort(order.begin(), order.end(),
                   [](const auto* a, const auto* b) { return a->priority > b->priority; });
  for (const SideTaskConfig* task : order) {
    auto g = given.find(task->name);
    tasks.push_back(g != given.end()
                        ? ProjectedTask{task->name, g->second, task->isolation == "process"}
                        : by_name[task->name]);
  }
  return tasks;
}

// The stage link and the all-reduce: the link model of the transport and fabric where either
// flag is given (the transport by default the one the config's parallel.transport picks:
// NCCL on CUDA, MPI on the CPU), else the flags' own defaults; a figure given outright wins.
absl::Status SetLinks(const ParsedFlags& flags, const Config& config, ProjectionOptions* options) {
  if (flags.Has("transport") || flags.Has("fabric")) {
    std::string transport = config.parallel.transport;
    if (transport == "auto") transport = config.runtime.device == "cuda" ? "nccl" : "mpi";
    FR_ASSIGN_OR_RETURN(
        pipeline::TransportLinks links,
        pipeline::TransportLinksOf(flags.Get("transport", transport), flags.Get("fabric", "ib")));
    options->link = links.link;
    options->network = links.network;
    options->links = links.description;
  } else {
    options->link.bandwidth_gbs = 50;
    options->link.latency_us = 5;
    options->network.bandwidth_gbs = 25;
    options->network.latency_us = 10;
  }
  FR_ASSIGN_OR_RETURN(options->link.bandwidth_gbs,
                      PositiveNumberFlag(flags, "link_gbs", options->link.bandwidth_gbs));
  FR_ASSIGN_OR_RETURN(options->link.latency_us,
                      PositiveNumberFlag(flags, "link_latency_us", options->link.latency_us));
  FR_ASSIGN_OR_RETURN(options->network.bandwidth_gbs,
                      PositiveNumberFlag(flags, "net_gbs", options->network.bandwidth_gbs));
  FR_ASSIGN_OR_RETURN(options->network.latency_us,
                      PositiveNumberFlag(flags, "net_latency_us", options->network.latency_us));
  return absl::OkStatus();
}

absl::StatusOr<std::string> RunProjection(const ParsedFlags& flags) {
  if (!flags.Has("config") || !flags.Has("gpus")) {
    return absl::InvalidArgumentError("project needs --config FILE and --gpus N[,N...]");
  }
  FR_ASSIGN_OR_RETURN(Config config, LoadConfigFile(flags.Get("config"), flags.GetAll("set")));
  FR_ASSIGN_OR_RETURN(GPT2Config model, ResolveModelConfig(config));
  ProjectionOptions options;
  FR_ASSIGN_OR_RETURN(options.gpus, GpuCounts(flags.Get("gpus")));
  FR_ASSIGN_OR_RETURN(
      options.micro_batch,
      PositiveIntFlag(flags, "micro_batch", config.train.batch_size / config.train.microbatches));
  FR_ASSIGN_OR_RETURN(
      options.global_batch,
      PositiveIntFlag(flags, "global_batch", config.train.batch_size * config.parallel.dp));
  options.seq_len = config.train.seq_len;
  options.message_bytes_per_value = MessageTypeBytes(
      MessageTypeOf(BackendOptions{config.runtime.device, config.runtime.precision}));
  FR_ASSIGN_OR_RETURN(options.kinds, Kinds(flags.Get("kinds", config.parallel.schedule == "file"
                                                                  ? "1f1b"
                                                                  : config.parallel.schedule)));
  FR_ASSIGN_OR_RETURN(
      int64_t chunks,
      PositiveIntFlag(flags, "chunks", std::max<int64_t>(2, config.parallel.chunks)));
  options.chunks = static_cast<int>(chunks);
  FR_RETURN_IF_ERROR(SetLinks(flags, config, &options));
  FR_ASSIGN_OR_RETURN(options.algorithm,
                      pipeline::ParseAllReduceAlgorithm(flags.Get("allreduce", "ring")));
  options.margin = config.freeride.margin;
  FR_ASSIGN_OR_RETURN(options.step_sync,
                      pipeline::ParseStepSync(flags.Get("step_sync", config.optim.step_sync)));
  // The run's own buckets unless the flag says otherwise.
  options.dp_bucket_mb = config.parallel.dp_bucket_mb;
  if (flags.Has("dp_bucket_mb")) {
    FR_ASSIGN_OR_RETURN(options.dp_bucket_mb, PositiveNumberFlag(flags, "dp_bucket_mb", 0));
  }
  const std::string costs = flags.Get("costs", "measure");
  if (costs == "measure") {
    const BackendOptions backend{config.runtime.device, config.runtime.precision, 0,
                                 config.runtime.fuse_gelu, config.runtime.attention,
                                 config.runtime.kernels};
    FR_ASSIGN_OR_RETURN(options.costs, MeasurePartCosts(backend, model, options.micro_batch,
                                                        options.seq_len, config.run.seed));
    if (!flags.Has("optimizer_ns")) {
      FR_ASSIGN_OR_RETURN(options.optimizer_ms_per_param,
                          MeasureOptimizerMsPerParam(backend, model, options.micro_batch,
                                                     options.seq_len, config.run.seed));
    }
  } else if (costs == "flops") {
    if (!flags.Has("tflops")) {
      return absl::InvalidArgumentError("--costs flops needs --tflops X (sustained TFLOP/s)");
    }
    FR_ASSIGN_OR_RETURN(double tflops, PositiveNumberFlag(flags, "tflops", 1));
    // FlopPartCosts counts FLOPs per token: times the tokens of a micro-batch, over the rate.
    const PartCosts flops = FlopPartCosts(model, options.seq_len);
    const double ms_per_flop =
        static_cast<double>(options.micro_batch * options.seq_len) / (tflops * 1e12) * 1e3;
    options.costs = {flops.embedding * ms_per_flop, flops.block * ms_per_flop,
                     flops.head * ms_per_flop};
  } else {
    FR_ASSIGN_OR_RETURN(options.costs, GivenCosts(flags));
  }
  if (flags.Has("optimizer_ns")) {
    FR_ASSIGN_OR_RETURN(double ns, PositiveNumberFlag(flags, "optimizer_ns", 0));
    options.optimizer_ms_per_param = ns * 1e-6;
  }
  // The memory table: the CUDA chunk's plan in the config's precision, on a GPU of this size.
  options.compute_bytes =
      config.runtime.device == "cuda" && config.runtime.precision == "bf16" ? 2 : 4;
  FR_ASSIGN_OR_RETURN(options.device_gib,
                      PositiveNumberFlag(flags, "gpu_memory_gib", options.device_gib));
  FR_ASSIGN_OR_RETURN(const auto given, GivenTaskTimes(flags, config));
  FR_ASSIGN_OR_RETURN(options.tasks, MeasureTasks(config, given));
  FR_ASSIGN_OR_RETURN(Projection projection, Project(model, options));
  const std::string format = flags.Get("format", "md");
  if (format == "md") {
    return ProjectionMarkdown(model, projection, options) +
           ProjectionMemoryMarkdown(model, projection, options);
  }
  if (format == "csv") return ProjectionCsv(projection);
  if (format == "json") return ProjectionJson(projection);
  if (format == "svg") return ProjectionSvg(projection);
  return absl::InvalidArgumentError(
      absl::StrCat("--format: expected md, csv, json or svg, found '", format, "'"));
}

}  // namespace

std::vector<FlagSpec> ProjectFlags() {
  return {
      {"config", "FILE", "the training config: model, batch, schedule, side tasks"},
      {"set", "SECTION.KEY=VALUE", "override one config key", true},
      {"gpus", "N[,N...]", "GPU counts to project, e.g. 1024,4096,8192"},
      {"global_batch", "B", "sequences per step (default train.batch_size × parallel.dp)"},
      {"micro_batch", "B", "sequences per micro-batch (default batch_size / microbatches)"},
      {"kinds", "LIST", "schedule kinds, or all (default parallel.schedule)"},
      {"chunks", "V", "model chunks per stage for interleaved (default 2)"},
      {"costs", "HOW",
       "measure (on runtime.device, default), flops (with --tflops), or "
       "embedding=ms,block=ms,head=ms per micro-batch"},
      {"tflops", "X", "sustained TFLOP/s per GPU for --costs flops"},
      {"optimizer_ns", "X",
       "AdamW update, ns per parameter (default: measured with "
       "--costs measure, else left out)"},
      {"task_ms", "NAME=MS,...",
       "side tasks' step times alone, given instead of measured (e.g. a GPU task on a CPU "
       "build)"},
      {"transport", "T",
       "nccl or mpi: the link model of that transport (default the config's "
       "parallel.transport; auto: nccl on CUDA, mpi on the CPU), with --fabric"},
      {"fabric", "F",
       "nvlink or ib: the link model's fabric (default ib where --transport is given); "
       "docs/scale.md gives the figures"},
      {"link_gbs", "X", "pipeline link bandwidth, GB/s (default 50, or the link model's)"},
      {"link_latency_us", "X", "pipeline link latency, µs (default 5, or the link model's)"},
      {"net_gbs", "X",
       "data-parallel all-reduce bus bandwidth per GPU, GB/s (default 25, or the link model's)"},
      {"net_latency_us", "X", "all-reduce latency per step, µs (default 10, or the link model's)"},
      {"allreduce", "ALG", "ring or tree (default ring)"},
      {"dp_bucket_mb", "X",
       "data-parallel all-reduce in X MiB buckets, each started as the last backward makes "
       "it (default parallel.dp_bucket_mb; 0: one all-reduce after the last backward)"},
      {"step_sync", "SYNC",
       "barrier or post_validate: how a step's end meets the next "
       "(default optim.step_sync)"},
      {"gpu_memory_gib", "X",
       "each GPU's memory for the memory table, GiB (default 80: an H100 80 GB's nominal "
       "size; give what your GPUs list)"},
      {"format", "FORMAT",
       "md (with the memory per stage), csv, json or svg (a plot against GPU count; default "
       "md)"},
      {"out", "FILE", "write to FILE instead of standard output"}};
}

int ProjectCommand(const ParsedFlags& flags) {
  absl::StatusOr<std::string> text = RunProjection(flags);
  if (!text.ok()) {
    std::cerr << "error: " << text.status().message() << "\n";
    return absl::IsInvalidArgument(text.status()) ? kExitUsage : kExitFailure;
  }
  return EmitOutput(flags, *text);
}

}  // namespace freeride
