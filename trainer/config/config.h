// The run configuration: one TOML file (sections as in docs/config.md), validated against a
// typed schema (trainer/config/config_schema.cc) that owns every key's type, range, default and
// documentation. Defaults are the member initialisers below; the schema reads them from a
// default-constructed Config, so there is one source of truth.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "freeride/task_args.h"

namespace freeride {

struct RunConfig {
  std::string dir = "runs/default";
  int64_t seed = 1337;
  int64_t log_every = 1;
  bool tensorboard = false;
};

struct ModelConfig {
  std::string init_from;
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  int64_t max_seq_len = 256;
  int64_t vocab_size = 50257;
  std::string recompute = "none";  // "none" | "selective" | "full" (models/recompute.h)
  std::string arch = "gpt2";  // "gpt2" | "llama"
  // The Llama family's keys (model.arch = "llama").
  int64_t n_kv_head = 0;  // 0: n_head (no grouping)
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  int64_t ffn_hidden = 0;  // 0: from ffn_multiplier and multiple_of
  double ffn_multiplier = 1.0;
  int64_t multiple_of = 256;
  bool tie_embeddings = true;
};

struct DataConfig {
  std::string train;
  std::string val;
  bool shuffle = false;
};

struct TrainConfig {
  int64_t batch_size = 8;
  int64_t seq_len = 64;
  int64_t microbatches = 1;
  int64_t steps = 100;
};

struct OptimConfig {
  double lr = 6e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;
  int64_t warmup_steps = 0;
  std::string schedule = "cosine";
  double min_lr_ratio = 0.1;
  double decay_fraction = 0.2;  // wsd
  bool reshape_schedule = false;
  std::string on_nonfinite = "stop";
  int64_t max_nonfinite_skips = 5;
  std::string step_sync = "barrier";
};

struct EvalConfig {
  int64_t every = 0;
  int64_t batches = 8;
};

struct CheckpointConfig {
  int64_t every = 0;
  std::string dir;
  std::string resume;
  int64_t keep_last = 0;
  bool background = true;
};

// parallel.dp_bucket_mb's least value above 0: 4 KiB, buckets of 1024 floats.
inline constexpr double kMinDpBucketMb = 1.0 / 256;

struct ParallelConfig {
  int64_t pp = 1;
  int64_t dp = 1;
  std::string schedule = "1f1b";
  std::string schedule_file;  // parallel.schedule = "file"
  int64_t chunks = 1;
  std::string partition = "balanced";
  std::vector<int64_t> layers_per_stage;
  std::vector<std::string> recompute_stages;  // per pipeline stage; empty: model.recompute
  double dp_bucket_mb = 0;  // 0: one data-parallel sum per chunk at REDUCE_GRADS
  int64_t zero = 0;         // 1: ZeRO-1, AdamW moments sharded over the data-parallel ranks
  bool zero_overlap = true;        // ZeRO-1's all-gather waited for at each chunk's next forward
  std::string transport = "auto";  // "auto" | "nccl" | "mpi" (trainer/transport_choice.h)
};

struct RuntimeConfig {
  std::string device = "cpu";
  std::string precision = "fp32";
  std::string fuse_gelu = "auto";
  std::string attention = "auto";
  std::string kernels = "auto";
  int64_t gpu = -1;  // this rank's CUDA device; -1: its node-local rank
  double comm_timeout_s = 300.0;
  bool emulate_peers = false;
  int64_t emulated_stage = 0;
  double link_bandwidth_gbs = 25.0;
  int64_t threads = 0;
  double peak_tflops = 0;
  double memory_fraction = 0.9;  // of the device's memory, for training and side work together
  double device_memory_mb = 0;   // the device's memory (MiB) to plan against; 0: the machine's
};

struct FreerideConfig {
  bool enabled = false;
  int64_t alternate_every = 0;
  int64_t calibration_steps = 3;
  double margin = 0.1;
  double step_timeout_s = 60;
  int64_t demote_after = 3;
  double serve_reserve = 0;  // share of a bubble kept for waiting requests; 0: one serve step
  bool jobs = true;
  std::string job_policy = "fifo";
  double job_age_limit_s = 600;
  double max_overhead = 0.01;
  std::string overhead_check = "on";
};

struct TraceConfig {
  std::vector<int64_t> steps = {2, 9};  // [first, last]: step 1 warms caches and thread pools
};

struct SideTaskConfig {
  std::string type;
  std::string name;                 // defaults to type
  std::string plugin;               // shared object providing `type`; empty: built-in
  std::vector<int64_t> stages;      // empty means every stage
  int64_t priority = 0;             // higher runs first
  int64_t memory_limit_bytes = 0;   // 0: no cap beyond what the stage has free
  std::string isolation;            // "process" | "inprocess"; empty: the type's default
  std::optional<bool> repeat;       // restart on fresh input once done; unset: false, but true
                                    // in a study (every arm keeps its task busy)
  TaskArgs args;
  // Where each key came from ("file:line:column"; "" is the [[side_tasks]] table itself,
  // "args.NAME" an argument), for errors found after parsing (`config check`, `train`).
  std::map<std::string, std::string> origins;
};

// Letters, digits, '_', '-' and '.', not starting with '.' or '-', at most 64 characters: a
// side task's name, which names its files and directories in run.dir.
bool IsPlainName(absl::string_view name);

// "process" for plugins and `command`, "inprocess" for the other built-in tasks.
std::string DefaultIsolation(const SideTaskConfig& task);

struct Config {
  RunConfig run;
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  OptimConfig optim;
  EvalConfig eval;
  CheckpointConfig checkpoint;
  ParallelConfig parallel;
  RuntimeConfig runtime;
  FreerideConfig freeride;
  TraceConfig trace;
  std::vector<SideTaskConfig> side_tasks;
  // "section.key" of every key the file or an override set (the rest kept their defaults):
  // lets a checkpoint's architecture rule where the config is silent.
  std::set<std::string> explicit_keys;
};

// Parses TOML `text` (named `source` in messages, usually its path), applies `overrides`
// ("section.key=value" or "side_tasks.N.key=value", values in TOML syntax; a bare word is
// taken as a string where a string is expected) and validates the result. On failure the
// status message holds one line per problem, each naming source:line:column, the key, what
// was expected and what was found. Every check runs in one pass: a key's own error skips only
// the cross-key rules that read it. With `check_data_files` (`config check`), data.train and
// data.val must each name an existing file (globs relative to the working directory).
absl::StatusOr<Config> ParseConfig(absl::string_view text, absl::string_view source,
                                   const std::vector<std::string>& overrides = {},
                                   bool check_data_files = false);

// Parses a fill job's file (`freeride submit`): exactly one [[side_tasks]] table and nothing
// else, with the keys, checks and file:line:column errors of a task in a config. `run` is the
// config of the run it goes to (its parallel.pp bounds the stages).
absl::StatusOr<SideTaskConfig> ParseSideTaskFile(absl::string_view text, absl::string_view source,
                                                 const Config& run);

// Reads and parses a config file.
absl::StatusOr<Config> LoadConfigFile(const std::string& path,
                                      const std::vector<std::string>& overrides = {},
                                      bool check_data_files = false);

// The effective config as TOML, every key spelled out; parses back to an equal Config.
std::string ConfigToToml(const Config& config);

// docs/config.md, generated from the schema (a test keeps the committed file equal to it).
std::string ConfigReferenceMarkdown();

// Parses "512MiB", "2 GiB", "100MB", "4096" into bytes.
absl::StatusOr<int64_t> ParseByteSize(absl::string_view text);
std::string FormatByteSize(int64_t bytes);

}  // namespace freeride
