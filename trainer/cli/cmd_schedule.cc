#include "trainer/cli/cmd_schedule.h"

#include <toml++/toml.h>

#include <iostream>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/files.h"
#include "core/status.h"
#include "models/backend.h"
#include "models/stage_message.h"
#include "pipeline/generators.h"
#include "pipeline/link_model.h"
#include "pipeline/network.h"
#include "pipeline/passes.h"
#include "pipeline/render.h"
#include "pipeline/schedule_file.h"
#include "pipeline/validator.h"
#include "trainer/cli/cli.h"
#include "trainer/config/config.h"
#include "trainer/pipeline_plan.h"
#include "trainer/trainer.h"

namespace freeride {
namespace {

using pipeline::CostModel;
using pipeline::Schedule;

std::vector<FlagSpec> CommonFlags() {
  return {
      {"kind", "KIND", "gpipe, 1f1b, interleaved, zbh1, zbh2, zbv or dualpipev (default 1f1b)"},
      {"stages", "P", "pipeline stages (default 4)"},
      {"microbatches", "M", "micro-batches per step (default 8)"},
      {"chunks", "V",
       "model chunks per stage (default 1; interleaved needs >= 2; zbv, dualpipev: 2)"},
      {"cost", "SPEC", "per-op milliseconds, e.g. f=1,b=2,w=1,comm=0.1 (also reduce=, opt=)"},
      {"cost-file", "FILE", "TOML cost model: f, b, w (a number or one per stage), comm, ..."},
      {"transport", "T",
       "nccl or mpi: comm from that transport's link model, as `project` takes it "
       "(default nccl where --fabric is given)"},
      {"fabric", "F", "nvlink or ib: the fabric under --transport (default ib)"},
      {"message-bytes", "N",
       "bytes of one activation message, for --transport (with --config: from its micro-batch)"},
      {"dp", "", "data-parallel: add REDUCE_GRADS before the optimizer"},
      {"step-sync", "SYNC",
       "barrier or post_validate: how a step's end meets the next "
       "(default barrier; with --config, optim.step_sync)"},
      {"input", "FILE", "load a schedule (text, CSV or torch CSV form) instead of generating one"},
      {"config", "FILE", "a training config's schedule and model split (FLOP-model costs)"},
      {"out", "FILE", "write to FILE instead of standard output"},
  };
}

absl::StatusOr<double> CostValue(const toml::node& node, const std::string& where) {
  std::optional<double> v = node.value<double>();
  if (!v || *v < 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": expected a number >= 0"));
  }
  return *v;
}

// The cost file: f, b, w as a number or a per-stage array; comm, reduce, opt numbers;
// memory_total, memory_static, memory_per_buffer integers (bytes).
// `link_comm`: comm comes from --transport, so a comm key here is refused.
absl::StatusOr<CostModel> LoadCostFile(const std::string& path, int stages, bool link_comm) {
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ":", e.source().begin.line, ": ",
                                                   std::string(e.description())));
  }
  CostModel model = CostModel::Uniform();
  for (auto&& [key_view, node] : root) {
    const std::string key(key_view.str());
    const std::string where = absl::StrCat(path, ":", node.source().begin.line, ": ", key);
    if (key == "f" || key == "b" || key == "w") {
      std::vector<double> values;
      if (const toml::array* array = node.as_array()) {
        for (const toml::node& element : *array) {
          FR_ASSIGN_OR_RETURN(double v, CostValue(element, where));
          values.push_back(v);
        }
        if (static_cast<int>(values.size()) != stages) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": expected ", stages,
                                                         " values (one per stage), found ",
                                                         values.size()));
        }
      } else {
        FR_ASSIGN_OR_RETURN(double v, CostValue(node, where));
        values.assign(stages, v);
      }
      if (model.stages.size() == 1) model.stages.assign(stages, model.stages[0]);
      for (int s = 0; s < stages; ++s) {
        (key == "f" ? model.stages[s].f : key == "b" ? model.stages[s].b : model.stages[s].w) =
            values[s];
      }
    } else if (key == "comm" && link_comm) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": comm is given by --transport; drop one of them"));
    } else if (key == "comm" || key == "reduce" || key == "opt") {
      FR_ASSIGN_OR_RETURN(double v, CostValue(node, where));
      (key == "comm" ? model.comm : key == "reduce" ? model.reduce : model.optimizer) = v;
    } else if (key == "tied") {
      FR_ASSIGN_OR_RETURN(model.tied, CostValue(node, where));
    } else if (key == "memory_total" || key == "memory_static" || key == "memory_per_buffer") {
      // value_exact: toml++'s value<int64_t> casts a float unchecked (undefined past int64_t).
      std::optional<int64_t> v = node.value_exact<int64_t>();
      if (!v || *v < 0) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": expected whole bytes >= 0"));
      }
      (key == "memory_total" ? model.memory_total
       : key == "memory_static" ? model.memory_static : model.memory_per_buffer) = *v;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": unknown key; expected f, b, w, comm, reduce, tied, opt, memory_total, "
                 "memory_static or memory_per_buffer"));
    }
  }
  return model;
}

// What the flags ask for. Every error found reading them is bad usage (exit 2); what fails
// after, reading a file or building and validating the schedule, is the work's (exit 1).
struct Request {
  pipeline::ScheduleOptions options;  // a generated schedule's kind and sizes, --dp, --step-sync
  std::optional<CostModel> cost;      // --cost (a --cost-file is read once the stages are known)
  // --transport / --fabric: the stage link, and --message-bytes (0: from --config).
  std::optional<pipeline::TransportLinks> links;
  int64_t message_bytes = 0;
};

// Whether a --cost spec names comm (its value alone cannot say: comm=0 is a choice too).
bool SpecGivesComm(absl::string_view spec) {
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    if (absl::StripAsciiWhitespace(item.substr(0, item.find('='))) == "comm") return true;
  }
  return false;
}

// The link model of --transport over --fabric, as `freeride project` takes it. Two sources for
// one number would leave a reader guessing which counted, so an explicit comm= is refused with it.
absl::Status ParseLink(const ParsedFlags& flags, Request* request) {
  if (!flags.Has("transport") && !flags.Has("fabric")) {
    if (flags.Has("message-bytes")) {
      return absl::InvalidArgumentError(
          "--message-bytes sizes the link of --transport or --fabric, given neither");
    }
    return absl::OkStatus();
  }
  FR_ASSIGN_OR_RETURN(request->links, pipeline::TransportLinksOf(flags.Get("transport", "nccl"),
                                                                 flags.Get("fabric", "ib")));
  if (flags.Has("cost") && SpecGivesComm(flags.Get("cost"))) {
    return absl::InvalidArgumentError(
        "--cost comm= and --transport both give the message time; drop one of them");
  }
  if (flags.Has("message-bytes") || !flags.Has("config")) {
    if (!flags.Has("message-bytes")) {
      return absl::InvalidArgumentError(
          "--transport needs --message-bytes N, the bytes of one activation message");
    }
    FR_ASSIGN_OR_RETURN(request->message_bytes, PositiveIntFlag(flags, "message-bytes", 1));
  }
  return absl::OkStatus();
}

// One message's milliseconds over the link, with a line saying what was assumed; nothing
// without --transport.
std::string ApplyLink(const Request& request, int64_t message_bytes, CostModel* cost) {
  if (!request.links) return "";
  const double bytes = static_cast<double>(message_bytes);
  cost->comm = pipeline::PointToPointMs(request.links->link, bytes);
  return absl::StrCat("link: ", request.links->description, "; ", message_bytes,
                      "-byte messages: comm ", absl::StrFormat("%.6g", cost->comm), " ms");
}

absl::StatusOr<Request> ParseRequest(const ParsedFlags& flags) {
  if (flags.Has("cost") && flags.Has("cost-file")) {
    return absl::InvalidArgumentError("give --cost or --cost-file, not both");
  }
  if (flags.Has("config")) {
    for (const char* other :
         {"kind", "stages", "microbatches", "chunks", "input", "dp", "step-sync"}) {
      if (flags.Has(other)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", other, " comes from the training config with --config"));
      }
    }
  }
  if (flags.Has("input")) {
    for (const char* generated : {"kind", "stages", "microbatches", "chunks"}) {
      if (flags.Has(generated)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--", generated, " describes a generated schedule; --input gives its own"));
      }
    }
  }
  Request request;
  if (flags.Has("cost")) {
    absl::StatusOr<CostModel> cost = pipeline::ParseCostSpec(flags.Get("cost"));
    if (!cost.ok()) return absl::InvalidArgumentError(absl::StrCat("--", cost.status().message()));
    request.cost = *cost;
  }
  FR_RETURN_IF_ERROR(ParseLink(flags, &request));
  pipeline::ScheduleOptions& options = request.options;
  FR_ASSIGN_OR_RETURN(options.kind, pipeline::ParseScheduleKind(flags.Get("kind", "1f1b")));
  FR_ASSIGN_OR_RETURN(const int64_t stages, PositiveIntFlag(flags, "stages", 4));
  FR_ASSIGN_OR_RETURN(const int64_t microbatches, PositiveIntFlag(flags, "microbatches", 8));
  FR_ASSIGN_OR_RETURN(const int64_t chunks, PositiveIntFlag(flags, "chunks", 1));
  options.stages = static_cast<int>(stages);
  options.microbatches = static_cast<int>(microbatches);
  options.chunks = static_cast<int>(chunks);
  options.data_parallel = flags.Has("dp");
  FR_ASSIGN_OR_RETURN(options.step_sync,
                      pipeline::ParseStepSync(flags.Get("step-sync", "barrier")));
  return request;
}

// --cost, or --cost-file sized for `stages`; without either the uniform model.
absl::StatusOr<CostModel> CostOf(const ParsedFlags& flags, const Request& request, int stages) {
  if (request.cost) return *request.cost;
  if (flags.Has("cost-file")) {
    return LoadCostFile(flags.Get("cost-file"), stages, request.links.has_value());
  }
  return CostModel::Uniform();
}

struct Built {
  Schedule schedule;
  CostModel cost;
  std::string split;  // --config: how the model was split over the stages
  std::string link;   // --transport: the link model and the comm it gives
};

// A training config's schedule, with each chunk's cost from the FLOP model of its blocks,
// embedding and head (CostModelFromParts, in units of one block's F + B + W).
absl::StatusOr<Built> BuildFromConfig(const ParsedFlags& flags, const Request& request) {
  FR_ASSIGN_OR_RETURN(Config config, LoadConfigFile(flags.Get("config")));
  FR_ASSIGN_OR_RETURN(GPT2Config model, ResolveModelConfig(config));
  FR_ASSIGN_OR_RETURN(PipelinePlan plan, PlanPipeline(config, model));
  // In units of one block's F + B + W.
  const PartCosts flops = FlopPartCosts(model, config.train.seq_len);
  const PartCosts parts{flops.embedding / flops.block, 1.0, flops.head / flops.block};
  const int pp = static_cast<int>(config.parallel.pp);
  Built built;
  built.cost = CostModelFromParts(plan.specs, parts, plan.placement, pp);
  if (request.cost || flags.Has("cost-file")) {
    FR_ASSIGN_OR_RETURN(built.cost, CostOf(flags, request, pp));
  }
  // Without --message-bytes, the message a stage sends: one micro-batch's activations.
  const int64_t message_bytes = request.message_bytes > 0
                                    ? request.message_bytes
                                    : config.train.batch_size / config.train.microbatches *
                                          config.train.seq_len * model.n_embd *
                                          MessageTypeBytes(MessageTypeOf(BackendOptions{
                                              config.runtime.device, config.runtime.precision}));
  built.link = ApplyLink(request, message_bytes, &built.cost);
  FR_ASSIGN_OR_RETURN(built.schedule, TrainingSchedule(config, plan, built.cost));
  FR_RETURN_IF_ERROR(pipeline::Validate(built.schedule));
  built.split = absl::StrCat("split ", plan.partition, ": ", DescribePartition(plan, pp));
  if (!plan.warning.empty()) std::cerr << "warning: " << plan.warning << "\n";
  return built;
}

// Generates or loads the schedule, validates it, and places its bubbles.
absl::StatusOr<Built> Build(const ParsedFlags& flags, const Request& request) {
  if (flags.Has("config")) return BuildFromConfig(flags, request);
  Built built;
  if (!flags.Has("input")) {
    pipeline::ScheduleOptions options = request.options;
    FR_ASSIGN_OR_RETURN(built.cost, CostOf(flags, request, options.stages));
    built.link = ApplyLink(request, request.message_bytes, &built.cost);
    options.cost = built.cost;
    FR_ASSIGN_OR_RETURN(built.schedule, pipeline::BuildSchedule(options));  // bubbles placed
    FR_RETURN_IF_ERROR(pipeline::Validate(built.schedule));
    return built;
  }
  // Bubbles are placed below, once the cost model (sized by the file's stages) is read.
  FR_ASSIGN_OR_RETURN(built.schedule, pipeline::LoadScheduleFile(flags.Get("input"),
                                                                 CostModel::Uniform(),
                                                                 flags.Has("dp")));
  FR_ASSIGN_OR_RETURN(built.cost, CostOf(flags, request, built.schedule.stages));
  built.link = ApplyLink(request, request.message_bytes, &built.cost);
  if (flags.Has("step-sync")) built.schedule.step_sync = request.options.step_sync;
  // A loaded schedule's bubbles (if any) came from another cost model: place them anew.
  FR_RETURN_IF_ERROR(pipeline::InsertBubbles(&built.schedule, built.cost));
  return built;
}

// The split and the link, a line each where there is one, each line after `prefix`.
std::string Header(const Built& built, absl::string_view prefix) {
  std::string out;
  for (const std::string* line : {&built.split, &built.link}) {
    if (!line->empty()) absl::StrAppend(&out, prefix, *line, "\n");
  }
  return out;
}

int FailSchedule(const absl::Status& status, int exit_status = kExitFailure) {
  std::cerr << "error: " << status.message() << (absl::EndsWith(status.message(), "\n") ? "" : "\n");
  return exit_status;
}

// The schedule the flags ask for: kExitUsage into `*exit_status` when they cannot be read,
// kExitFailure when it cannot be built.
std::optional<Built> BuildOrReport(const ParsedFlags& flags, int* exit_status) {
  absl::StatusOr<Request> request = ParseRequest(flags);
  if (!request.ok()) {
    *exit_status = FailSchedule(request.status(), kExitUsage);
    return std::nullopt;
  }
  absl::StatusOr<Built> built = Build(flags, *request);
  if (!built.ok()) {
    *exit_status = FailSchedule(built.status());
    return std::nullopt;
  }
  return *std::move(built);
}

}  // namespace

const std::vector<FlagSpec>& ScheduleFlags() {
  static const std::vector<FlagSpec> flags = [] {
    std::vector<FlagSpec> f = CommonFlags();
    f.push_back({"format", "FORMAT", "text, csv, torch, json, chrome or svg (default text)"});
    return f;
  }();
  return flags;
}

const std::vector<FlagSpec>& SimulateFlags() {
  static const std::vector<FlagSpec> flags = [] {
    std::vector<FlagSpec> f = CommonFlags();
    f.push_back({"format", "FORMAT", "text or json (default text)"});
    return f;
  }();
  return flags;
}

int ScheduleCommand(const ParsedFlags& flags) {
  const std::string format = flags.Get("format", "text");
  if (format != "text" && format != "csv" && format != "torch" && format != "json" &&
      format != "chrome" && format != "svg") {
    return FailSchedule(
        absl::InvalidArgumentError(absl::StrCat(
            "--format: expected text, csv, torch, json, chrome or svg, found '", format, "'")),
        kExitUsage);
  }
  int status = kExitOk;
  std::optional<Built> built = BuildOrReport(flags, &status);
  if (!built) return status;
  if (format != "text") std::cerr << Header(*built, "");
  if (format == "text") {
    return EmitOutput(flags, Header(*built, "# ") + pipeline::ScheduleToText(built->schedule));
  }
  if (format == "csv") return EmitOutput(flags, pipeline::ScheduleToCsv(built->schedule));
  if (format == "torch") return EmitOutput(flags, pipeline::ScheduleToTorchCsv(built->schedule));
  absl::StatusOr<pipeline::SimResult> sim = pipeline::Simulate(built->schedule, built->cost);
  if (!sim.ok()) return FailSchedule(sim.status());
  if (format == "json") return EmitOutput(flags, pipeline::SummaryJson(built->schedule, *sim));
  if (format == "chrome") return EmitOutput(flags, pipeline::ChromeTrace(built->schedule, *sim));
  return EmitOutput(flags, pipeline::GanttSvg(built->schedule, *sim));
}

int SimulateCommand(const ParsedFlags& flags) {
  const std::string format = flags.Get("format", "text");
  if (format != "text" && format != "json") {
    return FailSchedule(absl::InvalidArgumentError(
                            absl::StrCat("--format: expected text or json, found '", format, "'")),
                        kExitUsage);
  }
  int status = kExitOk;
  std::optional<Built> built = BuildOrReport(flags, &status);
  if (!built) return status;
  absl::StatusOr<pipeline::SimResult> sim = pipeline::Simulate(built->schedule, built->cost);
  if (!sim.ok()) return FailSchedule(sim.status());
  if (format == "json") {
    std::cerr << Header(*built, "");
    return EmitOutput(flags, pipeline::SummaryJson(built->schedule, *sim));
  }
  return EmitOutput(flags, Header(*built, "") + pipeline::SummaryText(built->schedule, *sim));
}

}  // namespace freeride
