#include "trainer/cli/cmd_train.h"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/device.h"
#include "core/json_string.h"
#include "core/logging.h"
#include "core/run_lock.h"
#include "core/status.h"
#include "core/stop_request.h"
#include "models/gpt2.h"
#include "models/kv_decoder.h"
#include "models/llama.h"
#include "models/llmc_checkpoint.h"
#include "models/sampling.h"
#include "models/tokenizer.h"
#include "pipeline/comm/transport.h"
#include "trainer/checkpoint_manifest.h"
#include "trainer/cli/cli.h"
#include "trainer/config/default_config.h"
#include "trainer/run_dir.h"
#include "trainer/study/study.h"
#include "trainer/train_state.h"
#include "trainer/trainer.h"
#include "trainer/transport_choice.h"

namespace freeride {
namespace {

int FailTrain(const absl::Status& status) {
  for (absl::string_view line : absl::StrSplit(status.message(), '\n')) {
    std::cerr << absl::StrCat("error: ", line, "\n");  // one write: ranks share the terminal
    WriteToLogFile(absl::StrCat("error: ", line));
  }
  return kExitFailure;
}

// The transport parallel.transport chooses over the job's MPI world: null for MPI itself, else
// NCCL started over it (collective: every rank chooses alike). Logs which carries what.
absl::StatusOr<std::unique_ptr<pipeline::Transport>> TrainingTransport(const Config& config,
                                                                       pipeline::Transport& mpi) {
#if defined(FREERIDE_WITH_NCCL) && !defined(FREERIDE_CUDA_EMULATED)
  constexpr bool kNcclAcrossProcesses = true;
#else
  constexpr bool kNcclAcrossProcesses = false;
#endif
  FR_ASSIGN_OR_RETURN(TransportChoice choice,
                      ChooseTransport(config, mpi.size(), kNcclAcrossProcesses));
  int gpu = GpuOf(config);
  std::unique_ptr<pipeline::Transport> nccl;
#if defined(FREERIDE_WITH_NCCL) && !defined(FREERIDE_CUDA_EMULATED)
  if (choice.nccl) {
    const DeviceInventory devices = DiscoverDevices();
    if (devices.cuda.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("parallel.transport chose NCCL, but this rank sees no CUDA device: ",
                       devices.cuda_unavailable));
    }
    gpu %= static_cast<int>(devices.cuda.size());
    FR_ASSIGN_OR_RETURN(pipeline::NcclTransportOptions options, NcclOptionsOf(config));
    options.device = gpu;
    FR_ASSIGN_OR_RETURN(nccl, pipeline::MakeNcclTransport(mpi, options));
  }
#endif
  FR_LOG(INFO) << DescribeTransport(choice, gpu);
  return nccl;
}

// Every rank's log lines go to run.dir/log_rankNNN.txt beside stderr (appended on a resume),
// until the command returns.
absl::Status LogToRunDir(const Config& config, int rank) {
  return SetLogFile(
      (std::filesystem::path(config.run.dir) / absl::StrFormat("log_rank%03d.txt", rank))
          .string());
}
struct RunLogCloser {
  ~RunLogCloser() { CloseLogFile(); }
};

// A run.dir that holds another run is refused as bad usage: the command line needs a resume,
// another run.dir or --overwrite.
int ExitCodeOfRunDir(const absl::Status& status) {
  return absl::IsAlreadyExists(status) ? kExitUsage : kExitFailure;
}

constexpr char kOverwriteHelp[] =
    "replace what another run left in run.dir (metrics, traces, study, checkpoints) instead "
    "of refusing to start there";
constexpr char kCheckRunDirHelp[] =
    "only say whether run.dir can take this run (exit 0, or 2 with the ways out) and change "
    "nothing: launch/run.sh asks before it starts the ranks";

template <typename N>
bool ParseNumber(const ParsedFlags& flags, const std::string& name, N* value) {
  if (!flags.Has(name)) return true;
  bool ok;
  if constexpr (std::is_floating_point_v<N>) {
    ok = absl::SimpleAtod(flags.Get(name), value) && std::isfinite(*value);
  } else {
    ok = absl::SimpleAtoi(flags.Get(name), value);
  }
  if (!ok) {
    std::cerr << "error: --" << name << " expects a finite number, found '" << flags.Get(name)
              << "'\n";
  }
  return ok;
}

// The model --checkpoint names (a checkpoint.dir, a checkpoint or an llm.c file), checked
// against its checkpoint's manifest when it has one.
absl::StatusOr<LlmcModel> ReadCheckpointModel(const std::string& checkpoint) {
  absl::StatusOr<std::string> file = ModelFileOf(checkpoint);
  if (!file.ok()) return file.status();
  if (absl::Status s = VerifyModelFile(*file); !s.ok()) return s;
  return ReadLlmcModel(*file);
}

// The mean loss over `batches` batches of `loader` of the model `weights` holds, on its
// family's CPU stage (forward only: no optimizer state).
template <typename Stage>
absl::StatusOr<double> MeanLoss(const LlmcModel& weights, TokenLoader& loader, int64_t B, int64_t T,
                                int64_t batches) {
  Stage model(weights.config, WholeModel(weights.config), B, T, 1);
  std::memcpy(model.params(), weights.params.data(), weights.params.size() * sizeof(float));
  double loss = 0;
  std::vector<int32_t> inputs(B * T), targets(B * T);
  for (int64_t b = 0; b < batches; ++b) {
    loader.Next(inputs.data(), targets.data());
    for (int64_t i = 0; i < B * T; ++i) {
      if (inputs[i] >= weights.config.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrFormat("the data holds token %d, outside the model's vocabulary of %d",
                            inputs[i], weights.config.vocab_size));
      }
    }
    std::memcpy(model.tokens(0), inputs.data(), B * T * sizeof(int32_t));
    std::memcpy(model.targets(0), targets.data(), B * T * sizeof(int32_t));
    loss += model.Forward(0);
  }
  return loss / static_cast<double>(batches);
}

}  // namespace

std::vector<FlagSpec> TrainFlags() {
  return {{"config", "FILE", "the run's TOML config (default: the embedded tiny CPU run)"},
          {"set", "SECTION.KEY=VALUE", "override one config key", true},
          {"overwrite", "", kOverwriteHelp},
          {"check_run_dir", "", kCheckRunDirHelp}};
}

// True when an MPI launcher (mpirun, srun with PMI/PMIx) started this process.
bool LaunchedByMpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

// A run stopped by a signal ends with kExitStopped and its message on standard error (not
// as an error: the stop was asked for and the checkpoint is written).
int Stopped(const absl::Status& status) {
  std::cerr << absl::StrCat(status.message(), "\n");
  WriteToLogFile(status.message());
  return kExitStopped;
}

// Loads the config, and runs `work` on a Trainer: alone, or as one rank of an MPI job (a
// failure on any rank then ends the whole job: the others would wait for it until their
// timeouts). SIGTERM, SIGINT and SIGUSR1 ask the run to stop at the next step boundary.
// `adjust` fits the config to the command, or refuses it, before run.dir is created.
int WithTrainer(const ParsedFlags& flags, RunDirOptions run_dir,
                const std::function<absl::Status(Config&)>& adjust,
                const std::function<absl::Status(Trainer&, const Config&)>& work) {
  const std::vector<std::string> overrides = flags.GetAll("set");
  absl::StatusOr<Config> config =
      flags.Has("config") ? LoadConfigFile(flags.Get("config"), overrides)
                          : ParseConfig(DefaultConfigToml(), kDefaultConfigName, overrides);
  if (!config.ok()) return FailTrain(config.status());
  if (absl::Status s = adjust(*config); !s.ok()) return FailTrain(s);
  run_dir.overwrite = flags.Has("overwrite");
  if (flags.Has("check_run_dir")) {
    const absl::Status free = CheckRunDirFree(*config, run_dir);
    if (free.ok()) return kExitOk;
    FailTrain(free);
    return ExitCodeOfRunDir(free);
  }
  InstallStopHandlers();
  const RunLogCloser close_log;
  const RunOrigin origin{flags.Get("config"), overrides};
  if (!LaunchedByMpi()) {
    absl::StatusOr<DirectoryLock> lock = PrepareRunDir(*config, run_dir, origin);
    if (!lock.ok()) {
      FailTrain(lock.status());
      return ExitCodeOfRunDir(lock.status());
    }
    if (absl::Status s = LogToRunDir(*config, 0); !s.ok()) return FailTrain(s);
    absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(*config);
    if (!trainer.ok()) {
      FailTrain(trainer.status());
      return IsUsageError(trainer.status()) ? kExitUsage : kExitFailure;
    }
    absl::Status s = work(**trainer, *config);
    (*trainer)->RecordEnd(s);
    if (absl::IsCancelled(s)) return Stopped(s);
    return s.ok() ? kExitOk : FailTrain(s);
  }
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  SetLogRank(rank);
  auto fail = [&](const absl::Status& status, int code = kExitFailure) {
    const bool named = absl::StartsWith(status.message(), "rank ");
    FailTrain(named ? status
                    : absl::Status(status.code(),
                                   absl::StrFormat("rank %d: %s", rank, status.message())));
    MPI_Abort(MPI_COMM_WORLD, code);
    return code;
  };
  std::optional<DirectoryLock> lock;
  int refused = 0;  // rank 0's exit status when run.dir cannot take the run
  if (rank == 0) {
    absl::StatusOr<DirectoryLock> locked = PrepareRunDir(*config, run_dir, origin);
    if (locked.ok()) {
      lock = *std::move(locked);
    } else {
      refused = ExitCodeOfRunDir(locked.status());
      FailTrain(locked.status());
    }
  }
  // Rank 0 has made run.dir or refused it. A refusal ends every rank quietly with its status:
  // an MPI_Abort would follow its one message with Open MPI's report and the other ranks' stop
  // lines. Otherwise every rank logs there from now on.
  MPI_Bcast(&refused, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (refused != 0) {
    // Nothing is left to checkpoint: the signal mpirun sends the ranks still finishing when
    // rank 0 exits ends them quietly, not with a stop request's line.
    for (int signal : {SIGTERM, SIGINT, SIGUSR1}) std::signal(signal, SIG_DFL);
    MPI_Finalize();
    return refused;
  }
  if (absl::Status s = LogToRunDir(*config, rank); !s.ok()) return fail(s);
  bool stopped = false;
  {
    std::unique_ptr<pipeline::Transport> mpi = pipeline::MakeMpiTransport();
    absl::StatusOr<std::unique_ptr<pipeline::Transport>> transport =
        TrainingTransport(*config, *mpi);
    if (!transport.ok()) {
      // parallel.transport asks for what this run cannot have: bad usage.
      const bool usage = absl::IsInvalidArgument(transport.status()) ||
                         absl::IsFailedPrecondition(transport.status());
      return fail(transport.status(), usage ? kExitUsage : kExitFailure);
    }
    pipeline::Transport* carrier = *transport != nullptr ? transport->get() : mpi.get();
    absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(*config, carrier);
    if (!trainer.ok()) {
      return fail(trainer.status(), IsUsageError(trainer.status()) ? kExitUsage : kExitFailure);
    }
    absl::Status s = work(**trainer, *config);
    (*trainer)->RecordEnd(s);
    // Every rank agreed on the stop inside the step's sums, so all of them get here.
    if (absl::IsCancelled(s)) {
      stopped = true;
      if (rank == 0) Stopped(s);
    } else if (!s.ok()) {
      return fail(s);
    }
  }
  MPI_Finalize();
  return stopped ? kExitStopped : kExitOk;
}

int TrainCommand(const ParsedFlags& flags) {
  return WithTrainer(
      flags, RunDirOptions{}, [](Config&) { return absl::OkStatus(); },
      [](Trainer& trainer, const Config&) { return trainer.Run(); });
}

std::vector<FlagSpec> StudyFlags() {
  return {{"config", "FILE", "the run's TOML config, with freeride.enabled and [[side_tasks]]"},
          {"set", "SECTION.KEY=VALUE", "override one config key", true},
          {"rounds", "R", "how many times each arm's block comes at least (default 3)"},
          {"block_steps", "N", "training steps per block (default 4)"},
          {"target_ci", "PCT",
           "add rounds until every arm's overhead interval is within ±PCT percent (e.g. 2)"},
          {"max_rounds", "R", "with --target_ci: at most this many rounds (default 20)"},
          {"resume", "",
           "continue a stopped study from the rounds it saved in run.dir/study (same config "
           "and --block_steps): the report covers all of them"},
          {"overwrite", "", kOverwriteHelp},
          {"check_run_dir", "", kCheckRunDirHelp}};
}

int StudyCommand(const ParsedFlags& flags) {
  if (!flags.Has("config")) {
    std::cerr << "error: study needs --config FILE (a config with freeride.enabled and "
                 "[[side_tasks]] to compare)\n";
    return kExitUsage;
  }
  StudyOptions options;
  int64_t rounds = options.rounds, block = options.block_steps, max_rounds = options.max_rounds;
  double target_pct = 0;
  if (!ParseNumber(flags, "rounds", &rounds) || !ParseNumber(flags, "block_steps", &block) ||
      !ParseNumber(flags, "max_rounds", &max_rounds) ||
      !ParseNumber(flags, "target_ci", &target_pct)) {
    return kExitUsage;
  }
  if (rounds < 1 || block < 1 || max_rounds < 1) {
    std::cerr << "error: --rounds, --block_steps and --max_rounds take integers >= 1\n";
    return kExitUsage;
  }
  if (flags.Has("target_ci") && !(target_pct > 0 && target_pct < 100)) {
    std::cerr << "error: --target_ci takes a percentage above 0 and below 100, found '"
              << flags.Get("target_ci") << "'\n";
    return kExitUsage;
  }
  if (flags.Has("max_rounds") && !flags.Has("target_ci")) {
    std::cerr << "error: --max_rounds bounds the rounds --target_ci adds; give --target_ci\n";
    return kExitUsage;
  }
  if (flags.Has("target_ci") && max_rounds < rounds) {
    std::cerr << "error: --max_rounds " << max_rounds << " is below --rounds " << rounds << "\n";
    return kExitUsage;
  }
  options.rounds = static_cast<int>(rounds);
  options.block_steps = static_cast<int>(block);
  options.max_rounds = static_cast<int>(max_rounds);
  options.target_ci = target_pct / 100;
  options.resume = flags.Has("resume");
  if (options.resume && flags.Has("overwrite")) {
    std::cerr << "error: --resume continues the study in run.dir/study, --overwrite replaces "
                 "it: give one\n";
    return kExitUsage;
  }
  SetStopNotice(
      "freeride: stop requested; the study stops at the next step boundary and writes the "
      "report of the rounds it completed (send the signal again to exit at once)\n");
  // A study writes no checkpoint: those of the run it may resume from are not in its way.
  return WithTrainer(
      flags, RunDirOptions{.checkpoints = false, .keep = options.resume},
      // The study decides when side tasks run and how many steps there may be.
      [&](Config& config) {
        // Its arms are measured against each other: fill jobs would run in all of them.
        config.freeride.jobs = false;
        PrepareStudyConfig(config, options);
        return CheckStudyConfig(config);
      },
      [&](Trainer& trainer, const Config& config) -> absl::Status {
        absl::StatusOr<std::string> table = RunStudy(trainer, config, options);
        if (!table.ok()) return table.status();
        if (trainer.side_tasks() != nullptr) trainer.side_tasks()->Finish();
        if (absl::Status s = trainer.WriteTimelines(); !s.ok()) return s;
        std::cout << *table << std::flush;
        return absl::OkStatus();
      });
}

std::vector<FlagSpec> SampleFlags() {
  return {{"checkpoint", "PATH", "a checkpoint directory or an llm.c model file"},
          {"prompt", "TEXT", "text to continue (default: start of a document)"},
          {"tokens", "N", "tokens to generate (default 64)"},
          {"temperature", "X", "softmax temperature; 0 picks the most likely token (default 1)"},
          {"top_k", "K", "sample among the K most likely tokens; 0: all (default 40)"},
          {"seed", "N", "random seed (default 1337)"},
          {"format", "text|jsonl",
           "text: the prompt and its continuation as it is sampled (default); jsonl: one record "
           "with the prompt's and the generated token ids and the decoded text"},
          {"tokenizer", "FILE", "GPT-2 BPE ranks (default data/r50k_base.tiktoken)"}};
}

int SampleCommand(const ParsedFlags& flags) {
  if (!flags.Has("checkpoint")) {
    std::cerr << "error: sample needs --checkpoint PATH\n";
    return kExitUsage;
  }
  int64_t tokens = 64, top_k = 40, seed = 1337;
  double temperature = 1.0;
  if (!ParseNumber(flags, "tokens", &tokens) || !ParseNumber(flags, "top_k", &top_k) ||
      !ParseNumber(flags, "seed", &seed) || !ParseNumber(flags, "temperature", &temperature) ||
      tokens < 1 || top_k < 0 || temperature < 0) {
    std::cerr << "error: --tokens must be >= 1, --top_k and --temperature >= 0\n";
    return kExitUsage;
  }
  const std::string format = flags.Get("format", "text");
  if (format != "text" && format != "jsonl") {
    std::cerr << "error: --format takes text or jsonl, found '" << format << "'\n";
    return kExitUsage;
  }
  auto tokenizer = Tokenizer::Load(flags.Get("tokenizer", kDefaultTokenizerPath));
  if (!tokenizer.ok()) return FailTrain(tokenizer.status());
  absl::StatusOr<LlmcModel> weights = ReadCheckpointModel(flags.Get("checkpoint"));
  if (!weights.ok()) return FailTrain(weights.status());
  const GPT2Config& config = weights->config;
  // As `serve` starts a request: <|endoftext|>, or id 0 in a vocabulary without it.
  std::vector<int32_t> context{kEndOfText < config.vocab_size ? kEndOfText : 0};
  if (flags.Has("prompt")) {
    absl::StatusOr<std::vector<int32_t>> ids = (*tokenizer)->Encode(flags.Get("prompt"));
    if (!ids.ok()) return FailTrain(ids.status());
    for (int32_t id : *ids) {
      if (id >= config.vocab_size) {
        return FailTrain(absl::InvalidArgumentError(
            absl::StrFormat("the prompt has token %d, outside the model's %d-token vocabulary", id,
                            config.vocab_size)));
      }
    }
    context.insert(context.end(), ids->begin(), ids->end());
  }
  const int64_t room = config.max_seq_len - static_cast<int64_t>(context.size());
  if (room < 1) {
    return FailTrain(absl::InvalidArgumentError(
        absl::StrFormat("the prompt has %d tokens; the model's context holds %d",
                        context.size() - 1, config.max_seq_len)));
  }
  if (tokens > room) {
    std::cerr << absl::StrFormat("note: generating %d tokens, what the model's context of %d "
                                 "leaves after the prompt\n", room, config.max_seq_len);
    tokens = room;
  }
  // The prompt goes through the key/value cache once; each new token then costs one position.
  absl::StatusOr<std::unique_ptr<KvDecoder<float>>> decoder =
      MakeKvDecoder<float>(config, weights->params.data(), 1, context.size() + tokens);
  if (!decoder.ok()) return FailTrain(decoder.status());
  absl::StatusOr<const float*> logits;
  for (int32_t token : context) {
    if (!(logits = (*decoder)->Step(&token)).ok()) return FailTrain(logits.status());
  }
  TokenSampler sampler(temperature, top_k, static_cast<uint64_t>(seed));
  const bool stream = format == "text";
  if (stream) std::cout << flags.Get("prompt") << std::flush;
  std::vector<int32_t> generated;
  for (int64_t n = 0; n < tokens; ++n) {
    const int32_t next = sampler.Next(*logits, config.vocab_size);
    generated.push_back(next);
    if (stream) {
      absl::StatusOr<std::string> text = (*tokenizer)->Decode({next});
      if (text.ok()) std::cout << *text << std::flush;
    }
    if (n + 1 < tokens && !(logits = (*decoder)->Step(&next)).ok())
      return FailTrain(logits.status());
  }
  if (stream) {
    std::cout << "\n";
    return kExitOk;
  }
  // One record: the prompt's and the generated token ids beside the decoded text.
  absl::StatusOr<std::string> text = (*tokenizer)->Decode(generated);
  if (!text.ok()) return FailTrain(text.status());
  std::cout << absl::StrFormat(
      "{\"prompt\": %s, \"prompt_tokens\": [%s], \"tokens\": [%s], \"text\": %s}\n",
      JsonString(flags.Get("prompt")), absl::StrJoin(context.begin() + 1, context.end(), ", "),
      absl::StrJoin(generated, ", "), JsonString(*text));
  return kExitOk;
}

std::vector<FlagSpec> EvalFlags() {
  return {{"checkpoint", "PATH", "a checkpoint directory or an llm.c model file"},
          {"data", "GLOB", "token shards to evaluate on (llm.c format)"},
          {"batch_size", "B", "sequences per batch (default 4)"},
          {"seq_len", "T", "tokens per sequence (default 64)"},
          {"batches", "N", "batches to average; 0: one pass over the data (default 0)"}};
}

int EvalCommand(const ParsedFlags& flags) {
  if (!flags.Has("checkpoint") || !flags.Has("data")) {
    std::cerr << "error: eval needs --checkpoint PATH and --data GLOB\n";
    return kExitUsage;
  }
  int64_t B = 4, T = 64, batches = 0;
  if (!ParseNumber(flags, "batch_size", &B) || !ParseNumber(flags, "seq_len", &T) ||
      !ParseNumber(flags, "batches", &batches) || B < 1 || T < 1 || batches < 0) {
    std::cerr << "error: --batch_size and --seq_len must be >= 1, --batches >= 0\n";
    return kExitUsage;
  }
  absl::StatusOr<LlmcModel> weights = ReadCheckpointModel(flags.Get("checkpoint"));
  if (!weights.ok()) return FailTrain(weights.status());
  if (T > weights->config.max_seq_len) {
    return FailTrain(absl::InvalidArgumentError(absl::StrFormat(
        "sequence length %d exceeds the model's max_seq_len %d", T, weights->config.max_seq_len)));
  }
  absl::StatusOr<TokenLoader> loader = TokenLoader::Open(flags.Get("data"), B, T, false, 0);
  if (!loader.ok()) return FailTrain(loader.status());
  if (batches == 0) batches = loader->batches_per_epoch();
  absl::StatusOr<double> loss = weights->config.is_llama()
                                    ? MeanLoss<LlamaStage<float>>(*weights, *loader, B, T, batches)
                                    : MeanLoss<GPT2Stage<float>>(*weights, *loader, B, T, batches);
  if (!loss.ok()) return FailTrain(loss.status());
  std::cout << absl::StrFormat("eval: %d batches of %d x %d tokens: mean loss %.6f\n", batches, B,
                               T, *loss);
  return kExitOk;
}

}  // namespace freeride
