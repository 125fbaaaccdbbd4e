#include "trainer/cli/cli.h"

#include <algorithm>
#include <functional>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/build_info.h"
#include "core/device.h"
#include "core/files.h"
#include "trainer/cli/cmd_checkpoint.h"
#include "trainer/cli/cmd_hf.h"
#include "trainer/cli/cmd_jobs.h"
#include "trainer/cli/cmd_prepare.h"
#include "trainer/cli/cmd_project.h"
#include "trainer/cli/cmd_report.h"
#include "trainer/cli/cmd_schedule.h"
#include "trainer/cli/cmd_train.h"
#include "trainer/config/config.h"
#include "trainer/config/config_schema.h"
#include "trainer/config/default_config.h"
#include "trainer/config/flags.h"
#include "trainer/config/side_task_check.h"
#include "trainer/memory_report.h"
#include "trainer/pipeline_plan.h"
#include "trainer/rank_memory.h"
#include "trainer/trainer.h"

namespace freeride {
namespace {

struct Command {
  std::string name;
  std::string usage;
  std::string summary;
  std::vector<FlagSpec> flags;
  std::function<int(const ParsedFlags&)> run;
  // The positional arguments the command takes ("FILE", "RUN_DIR JOB.toml"), or "" for none:
  // anything more is refused before the command runs, so a forgotten option name never runs
  // another job.
  std::string operand = "";
};

int Version(const ParsedFlags&) {
  for (const auto& [name, value] : BuildInfo()) {
    std::cout << absl::StrFormat("%-14s %s\n", name, value);
  }
  return kExitOk;
}

// Without a GPU the answer is one plain line; the CUDA runtime's own error is for --verbose.
int Devices(const ParsedFlags& flags) {
  DeviceInventory inventory = DiscoverDevices();
  std::cout << DescribeDevice(inventory.cpu) << "\n";
  for (const DeviceInfo& device : inventory.cuda) std::cout << DescribeDevice(device) << "\n";
  if (inventory.cuda.empty()) std::cout << "cuda: none (" << inventory.cuda_unavailable << ")\n";
  if (flags.Has("verbose") && !inventory.cuda_detail.empty()) {
    std::cout << "cuda detail: " << inventory.cuda_detail << "\n";
  }
  return kExitOk;
}

// Prints one line per problem, each already naming file:line and key.
int ReportConfigErrors(const absl::Status& status) {
  for (absl::string_view line : absl::StrSplit(status.message(), '\n')) {
    std::cerr << "error: " << line << "\n";
  }
  return kExitFailure;
}

// The config a `config` subcommand acts on: FILE, or the embedded default, with --set applied;
// with `check_data_files`, its data globs must name files, as the run will need them to.
absl::StatusOr<Config> ConfigFromFlags(const ParsedFlags& flags, bool check_data_files = false) {
  const std::vector<std::string> overrides = flags.GetAll("set");
  return flags.positional().empty()
             ? ParseConfig(DefaultConfigToml(), kDefaultConfigName, overrides, check_data_files)
             : LoadConfigFile(flags.positional()[0], overrides, check_data_files);
}

int ConfigCheck(const ParsedFlags& flags) {
  absl::StatusOr<Config> config = ConfigFromFlags(flags, !flags.Has("config_only"));
  if (!config.ok()) return ReportConfigErrors(config.status());
  // Side tasks are built as `train` builds them: their arguments, plugins and limits.
  std::vector<std::string> warnings;
  absl::Status tasks = ValidateSideTasks(*config, &warnings, nullptr, PlannedSideRooms(*config));
  // How the model will be split, where that is not what the config seems to say.
  if (absl::StatusOr<GPT2Config> model = ResolveModelConfig(*config); model.ok()) {
    absl::StatusOr<PipelinePlan> plan = PlanPipeline(*config, *model);
    if (plan.ok() && !plan->warning.empty()) warnings.push_back(plan->warning);
  }
  for (const std::string& w : warnings) std::cerr << "warning: " << w << "\n";
  if (!tasks.ok()) return ReportConfigErrors(tasks);
  std::cout << ConfigToToml(*config);
  return kExitOk;
}

int ConfigMemory(const ParsedFlags& flags) {
  absl::StatusOr<Config> config = ConfigFromFlags(flags);
  if (!config.ok()) return ReportConfigErrors(config.status());
  absl::StatusOr<std::string> summary = ModelSummary(*config);
  if (!summary.ok()) {
    std::cerr << "error: " << summary.status().message() << "\n";
    return kExitFailure;
  }
  std::cout << *summary;
  absl::StatusOr<std::string> report = DeviceMemoryReport(*config);
  if (!report.ok()) {
    std::cerr << "error: " << report.status().message() << "\n";
    return kExitFailure;
  }
  std::cout << *report;
  if (config->runtime.device == "cpu") {
    absl::StatusOr<std::string> host = HostMemoryReport(*config);
    if (!host.ok()) {
      std::cerr << "error: " << host.status().message() << "\n";
      return kExitFailure;
    }
    std::cout << *host;
  }
  absl::StatusOr<std::string> side = SideWorkReport(*config);
  if (!side.ok()) {
    std::cerr << "error: " << side.status().message() << "\n";
    return kExitFailure;
  }
  std::cout << *side;
  return kExitOk;
}

int ConfigDocs(const ParsedFlags&) {
  std::cout << ConfigReferenceMarkdown();
  return kExitOk;
}

const FlagSpec kSetFlag{"set", "SECTION.KEY=VALUE", "override one config key", true};

const std::vector<Command>& Commands() {
  static const std::vector<Command> commands = {
      {"version", "freeride version", "build facts and library versions", {}, Version},
      {"devices",
       "freeride devices [--verbose]",
       "the CPU and CUDA devices this process sees",
       {{"verbose", "", "also the CUDA runtime's error when no CUDA device is usable"}},
       Devices},
      {"config check",
       "freeride config check [FILE] [--set SECTION.KEY=VALUE]... [--config_only]",
       "validate a config (the embedded default when no FILE) and that its data files exist, "
       "and print the effective config",
       {kSetFlag,
        {"config_only", "",
         "leave out whether data.train and data.val name files (for a "
         "launcher whose ranks open them, perhaps on other hosts)"}},
       ConfigCheck,
       "FILE"},
      {"config memory",
       "freeride config memory [FILE] [--set SECTION.KEY=VALUE]...",
       "the model (parameters, training FLOPs per token), device memory each pipeline stage "
       "of a config's run would need on the CUDA backend (and, for a CPU run, host memory on "
       "the CPU backend, with its recomputation)",
       {kSetFlag},
       ConfigMemory,
       "FILE"},
      {"config docs",
       "freeride config docs",
       "print the configuration reference (docs/config.md)",
       {},
       ConfigDocs},
      {"train", "freeride train [--config FILE] [--set SECTION.KEY=VALUE]...",
       "train GPT-2 (the embedded tiny CPU run when no --config)", TrainFlags(), TrainCommand},
      {"study",
       "freeride study --config FILE [--rounds R] [--block_steps N] "
       "[--target_ci PCT [--max_rounds R]] [--resume] [--set ...]",
       "training alone vs with each side task and all, in shuffled blocks: the harvest table "
       "with 95% intervals and the A/A noise floor",
       StudyFlags(), StudyCommand},
      {"project",
       "freeride project --config FILE --gpus N[,N...] [--global_batch B] [--kinds LIST|all] "
       "[--costs measure|flops|SPEC] [--format md|csv|json]",
       "bubbles and reclaimable side work at N GPUs: every pp × dp that fits, one simulated "
       "pipeline each",
       ProjectFlags(), ProjectCommand},
      {"report", "freeride report RUN_DIR [RUN_DIR...] [--out FILE.html]",
       "a run (train or study, finished, failed or in progress) as one HTML page, and its "
       "ranks' timelines as one trace.json; several runs: one page comparing them",
       ReportFlags(), ReportCommand, "RUN_DIR..."},
      {"prepare",
       "freeride prepare --input FILE... --out DIR [--format auto|text|jsonl] [--text_field NAME] "
       "[--lines] [--ranks FILE --pattern P --special TEXT=ID...] [--val_tokens N]",
       "tokenize text or JSON Lines files (gzip'd or not) into token shards (llm.c format; "
       "32-bit ids where the vocabulary passes 65,536)",
       PrepareFlags(), PrepareCommand},
      {"sample",
       "freeride sample --checkpoint PATH [--prompt TEXT] [--tokens N] [--temperature X] "
       "[--top_k K] [--seed N] [--format text|jsonl] [--tokenizer FILE]",
       "generate text from a checkpoint", SampleFlags(), SampleCommand},
      {"eval", "freeride eval --checkpoint PATH --data GLOB [--batch_size B] [--seq_len T]",
       "mean loss of a checkpoint on token shards", EvalFlags(), EvalCommand},
      {"schedule",
       "freeride schedule --kind 1f1b --stages 4 --microbatches 8 [--chunks V] "
       "[--cost f=1,b=2,w=1,comm=0.1 | --cost-file FILE] [--dp] [--input FILE | --config FILE] "
       "[--format text|csv|torch|json|chrome|svg] [--out FILE]",
       "build, validate and print a pipeline schedule with its BUBBLE instructions",
       ScheduleFlags(), ScheduleCommand},
      {"submit", "freeride submit RUN_DIR JOB.toml [--name N] [--priority P] [--work SECONDS]",
       "queue a fill job (one [[side_tasks]] table) for the training in RUN_DIR: placed at a "
       "step boundary in the bubbles its step and memory fit; prints its id",
       SubmitFlags(), SubmitCommand, "RUN_DIR JOB.toml"},
      {"jobs", "freeride jobs RUN_DIR [--format text|json]",
       "every fill job of RUN_DIR: state, stages, work done, bubble time, time to finish, reason",
       JobsFlags(), JobsCommand, "RUN_DIR"},
      {"cancel",
       "freeride cancel RUN_DIR ID",
       "cancel a fill job (a running training ends it at its next step boundary)",
       {},
       CancelCommand,
       "RUN_DIR ID"},
      {"checkpoint verify",
       "freeride checkpoint verify DIR",
       "check a checkpoint's files (or every checkpoint's in a checkpoint.dir) against the "
       "sizes and CRC-32Cs its manifest recorded",
       {},
       CheckpointVerifyCommand,
       "DIR"},
      {"export",
       "freeride export --format hf CHECKPOINT OUT_DIR [--dtype fp32|bf16|fp16] [--shard_mb MB]",
       "a checkpoint (or llm.c model file) as a Hugging Face model directory: config.json "
       "(GPT2LMHeadModel) and safetensors",
       ExportFlags(), ExportCommand, "CHECKPOINT OUT_DIR"},
      {"import",
       "freeride import --format hf DIR --out FILE",
       "a Hugging Face GPT-2 directory (safetensors, sharded or not; fp32, bf16 or fp16) as an "
       "llm.c model file for model.init_from, sample and eval",
       ImportFlags(), ImportCommand, "DIR"},
      {"simulate",
       "freeride simulate --kind 1f1b --stages 4 --microbatches 8 [...] [--format text|json]",
       "simulate a schedule: step time, bubble fraction, per-stage bubbles by kind",
       SimulateFlags(), SimulateCommand},
  };
  return commands;
}

void PrintHelp(std::ostream& out) {
  out << "freeride: a GPT trainer with pipeline parallelism whose bubbles run side tasks\n\n"
         "usage: freeride COMMAND [options]\n       freeride --version\n\ncommands:\n";
  for (const Command& command : Commands()) {
    out << absl::StrFormat("  %-19s %s\n", command.name, command.summary);
  }
  out << "\n`freeride help COMMAND` or `freeride COMMAND --help` shows a command's options.\n";
}

void PrintCommandHelp(const Command& command, std::ostream& out) {
  out << "usage: " << command.usage << "\n\n" << command.summary << "\n";
  if (!command.flags.empty()) out << "\noptions:\n" << FlagsHelp(command.flags);
}

// The commands of a group ("config": check, memory, docs), or none when `word` names no group.
std::vector<const Command*> GroupCommands(const std::string& word) {
  std::vector<const Command*> group;
  for (const Command& command : Commands()) {
    if (absl::StartsWith(command.name, word + " ")) group.push_back(&command);
  }
  return group;
}

void PrintGroupHelp(const std::string& group, const std::vector<const Command*>& commands,
                    std::ostream& out) {
  out << "usage: freeride " << group << " SUBCOMMAND [options]\n\nsubcommands:\n";
  for (const Command* command : commands) {
    out << absl::StrFormat("  %-19s %s\n", command->name, command->summary);
  }
  out << "\n`freeride " << group << " SUBCOMMAND --help` shows a subcommand's options.\n";
}

bool AsksForHelp(const std::vector<std::string>& args) {
  return std::any_of(args.begin(), args.end(),
                     [](const std::string& a) { return a == "--help" || a == "-h"; });
}

// `--set train.steps 5`: the parser would take "train.steps" as the assignment and 5 as an
// operand, and complain about the operand; say what happened instead.
absl::Status CheckSetSpelling(const std::vector<std::string>& args) {
  for (size_t i = 0; i + 2 < args.size(); ++i) {
    if (args[i] != "--set" || args[i + 1].find('=') != std::string::npos ||
        absl::StartsWith(args[i + 2], "--")) {
      continue;
    }
    return absl::InvalidArgumentError(absl::StrFormat(
        "--set %s %s: a space instead of '=' (write --set %s=%s)", args[i + 1], args[i + 2],
        args[i + 1], args[i + 2]));
  }
  return absl::OkStatus();
}

// The longest command name that prefixes `args` ("config check" before "config").
// " (did you mean 'config check'?)" for a misspelt command or subcommand (`group`: the commands
// of the group that args[0] names, if it names one), or "".
std::string CommandSuggestion(const std::vector<std::string>& args,
                              const std::vector<const Command*>& group) {
  std::vector<std::string> candidates;
  for (const Command& command : Commands()) {
    std::vector<std::string> words = absl::StrSplit(command.name, ' ');
    if (group.empty()) {
      candidates.push_back(words[0]);
    } else if (words.size() > 1 && words[0] == args[0]) {
      candidates.push_back(words[1]);
    }
  }
  if (!group.empty() && args.size() < 2) return "";
  const std::string word = group.empty() ? args[0] : args[1];
  const std::string best = config_internal::Suggest(word, candidates);
  if (best.empty()) return "";
  return absl::StrCat(" (did you mean '", group.empty() ? "" : args[0] + " ", best, "'?)");
}

const Command* FindCommand(const std::vector<std::string>& args, size_t* consumed) {
  const Command* best = nullptr;
  for (const Command& command : Commands()) {
    std::vector<std::string> words = absl::StrSplit(command.name, ' ');
    if (words.size() > args.size()) continue;
    if (!std::equal(words.begin(), words.end(), args.begin())) continue;
    if (best == nullptr || words.size() > *consumed) {
      best = &command;
      *consumed = words.size();
    }
  }
  return best;
}

// Positional arguments and --set values the command cannot take, as a usage error; OK else.
absl::Status CheckArguments(const Command& command, const ParsedFlags& flags) {
  const std::vector<std::string>& positional = flags.positional();
  if (command.operand.empty() && !positional.empty()) {
    const bool config_file = absl::EndsWith(positional[0], ".toml") &&
                             std::any_of(command.flags.begin(), command.flags.end(),
                                         [](const FlagSpec& f) { return f.name == "config"; });
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s takes no positional arguments, found '%s'%s", command.name,
        absl::StrJoin(positional, "' '"),
        config_file ? absl::StrCat(" (a config goes after --config: --config ", positional[0],
                                   ")")
                    : ""));
  }
  const std::vector<std::string> operands = absl::StrSplit(command.operand, ' ');
  // An operand ending in "..." ("RUN_DIR...") takes any number.
  if (positional.size() > operands.size() && !absl::EndsWith(operands.back(), "...")) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s takes %s%s, found '%s'", command.name, operands.size() == 1 ? "one " : "",
        absl::StrJoin(operands, " and "), absl::StrJoin(positional, "' '")));
  }
  for (const std::string& assignment : flags.GetAll("set")) {
    if (assignment.find('=') == std::string::npos || assignment[0] == '=') {
      return absl::InvalidArgumentError(
          absl::StrFormat("--set '%s': expected SECTION.KEY=VALUE", assignment));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int EmitOutput(const ParsedFlags& flags, const std::string& text) {
  if (!flags.Has("out")) {
    std::cout << text;
    return kExitOk;
  }
  if (absl::Status s = WriteFileAtomically(flags.Get("out"), text); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return kExitFailure;
  }
  return kExitOk;
}

int RunCli(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h" ||
      (args[0] == "help" && args.size() == 1)) {
    PrintHelp(std::cout);
    return args.empty() ? kExitUsage : kExitOk;
  }
  const bool help = args[0] == "help";
  std::vector<std::string> rest(args.begin() + (help ? 1 : 0), args.end());
  if (rest[0] == "--version") rest[0] = "version";
  size_t consumed = 0;
  const Command* command = FindCommand(rest, &consumed);
  if (command == nullptr) {
    // A group without its subcommand ("config --help", "config"): its subcommands.
    const std::vector<const Command*> group = GroupCommands(rest[0]);
    const bool bare = rest.size() == 1;
    if (!group.empty() && (help || bare || AsksForHelp(rest))) {
      PrintGroupHelp(rest[0], group, help || !bare ? std::cout : std::cerr);
      return help || !bare ? kExitOk : kExitUsage;
    }
    std::cerr << "error: unknown command '" << absl::StrJoin(rest, " ") << "'"
              << CommandSuggestion(rest, group) << "\n\n";
    if (group.empty()) {
      PrintHelp(std::cerr);
    } else {
      PrintGroupHelp(rest[0], group, std::cerr);
    }
    return kExitUsage;
  }
  rest.erase(rest.begin(), rest.begin() + consumed);
  if (help || AsksForHelp(rest)) {
    PrintCommandHelp(*command, std::cout);
    return kExitOk;
  }
  if (absl::Status s = CheckSetSpelling(rest); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n\n";
    PrintCommandHelp(*command, std::cerr);
    return kExitUsage;
  }
  absl::StatusOr<ParsedFlags> flags = ParseFlags(rest, command->flags);
  absl::Status usage = flags.ok() ? CheckArguments(*command, *flags) : flags.status();
  if (!usage.ok()) {
    std::cerr << "error: " << usage.message() << "\n\n";
    PrintCommandHelp(*command, std::cerr);
    return kExitUsage;
  }
  return command->run(*flags);
}

}  // namespace freeride
