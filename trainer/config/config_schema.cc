#include "trainer/config/config_schema.h"

#include <algorithm>
#include <charconv>
#include <type_traits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace freeride::config_internal {
namespace {

template <typename T>
constexpr KeyType TypeOf() {
  if constexpr (std::is_same_v<T, int64_t>) return KeyType::kInt;
  if constexpr (std::is_same_v<T, double>) return KeyType::kFloat;
  if constexpr (std::is_same_v<T, bool>) return KeyType::kBool;
  if constexpr (std::is_same_v<T, std::string>) return KeyType::kString;
  if constexpr (std::is_same_v<T, std::vector<int64_t>>) return KeyType::kIntList;
  if constexpr (std::is_same_v<T, std::vector<std::string>>) return KeyType::kStringList;
}

KeySpec MakeKey(const char* section, const char* key, KeyType type,
                std::function<void*(Config&)> field) {
  KeySpec spec;
  spec.section = section;
  spec.key = key;
  spec.type = type;
  spec.field = std::move(field);
  return spec;
}

// FR_KEY(train, batch_size) binds "train.batch_size" to Config::train.batch_size, its type
// taken from the member.
#define FR_KEY(sec, name)                                                                         \
  MakeKey(#sec, #name, TypeOf<std::remove_cvref_t<decltype(std::declval<Config&>().sec.name)>>(), \
          [](Config& c) -> void* { return &c.sec.name; })

std::vector<KeySpec> BuildSchema() {
  return {
      FR_KEY(run, dir).Doc("Directory for this run's outputs: effective config, metrics.jsonl, "
                           "traces, checkpoints (unless checkpoint.dir is set)."),
      FR_KEY(run, seed).Min(0).Doc("Seed for initialisation, data shuffling and sampling."),
      FR_KEY(run, log_every).Min(1).Doc("Print a progress line every this many steps."),
      FR_KEY(run, tensorboard)
          .Doc("Also write metrics.jsonl's values as TensorBoard scalars, in "
               "run.dir/tensorboard/: a run `pipeline` (loss, val loss, lr, gradient norm, "
               "speed, MFU, the harvest) and one per stage (its bubble time, memory, bubbles "
               "and side tasks); `tensorboard --logdir run.dir/tensorboard`."),

      FR_KEY(model, init_from)
          .Doc("llm.c checkpoint to start from; empty for GPT-2's random "
               "initialisation. The checkpoint's architecture rules: model "
               "keys set here must agree with it."),
      FR_KEY(model, n_layer).Min(1).Max(1024).Doc("Transformer blocks."),
      FR_KEY(model, n_head).Min(1).Max(1024).Doc("Attention heads; must divide n_embd."),
      FR_KEY(model, n_embd).Min(1).Max(65536).Doc("Embedding width."),
      FR_KEY(model, max_seq_len).Min(1).Max(1 << 20).Doc("Positions in the position embedding."),
      FR_KEY(model, vocab_size)
          .Min(1)
          .Max(1 << 24)
          .Doc("Vocabulary size (50257 for GPT-2); padded to a multiple of 128 in memory."),
      FR_KEY(model, recompute)
          .Choices({"none", "selective", "full"})
          .Doc("Activation recomputation: what a micro-batch in flight keeps for its backward. "
               "\"selective\" recomputes each block's GELU (SwiGLU) output and, on the CPU, its "
               "attention probabilities (B·heads·T² values; the CUDA backend never keeps "
               "them); \"full\" keeps only each block's input and runs the blocks forward "
               "again in the backward (one more forward of the blocks: counted in MFU). Losses "
               "and gradients are the same bits as \"none\". Both backends, both families. "
               "parallel.recompute_stages overrides it per stage "
               "(docs/training.md#memory)."),
      FR_KEY(model, arch)
          .Choices({"gpt2", "llama"})
          .Doc("Model family: \"gpt2\" (LayerNorm, learned positions, GELU MLP, biases, head "
               "tied to the embedding; llm.c's layout) or \"llama\" (RMSNorm, rotary "
               "positions, SwiGLU MLP, grouped-query attention, no biases; the keys below). "
               "Both run on the CPU and the CUDA backend (fp32, bf16). "
               "docs/training.md#model-families."),
      FR_KEY(model, n_kv_head)
          .Min(0)
          .Max(1024)
          .Doc("llama: key/value heads of grouped-query attention; must divide n_head. 0: "
               "n_head (plain multi-head attention)."),
      FR_KEY(model, rope_theta).Min(0, true).Doc("llama: base of the rotary position embedding."),
      FR_KEY(model, norm_eps).Min(0, true).Doc("llama: RMSNorm's epsilon."),
      FR_KEY(model, ffn_hidden)
          .Min(0)
          .Doc("llama: hidden width of the SwiGLU MLP. 0: Llama 3's rule, 2/3 of 4·n_embd times "
               "ffn_multiplier, rounded up to a multiple of multiple_of."),
      FR_KEY(model, ffn_multiplier)
          .Min(0, true)
          .Doc("llama: multiplier of the SwiGLU width when ffn_hidden is 0."),
      FR_KEY(model, multiple_of)
          .Min(1)
          .Doc("llama: the SwiGLU width (when ffn_hidden is 0) is rounded up to a multiple of "
               "this."),
      FR_KEY(model, tie_embeddings)
          .Doc("llama: the LM head reuses the token embedding (true) or has its own matrix. "
               "GPT-2 always ties them."),

      FR_KEY(data, train).Required().Doc("Training token shards (llm.c format); a path or a glob."),
      FR_KEY(data, val).Doc("Validation token shards; a path or a glob. Empty: no validation."),
      FR_KEY(data, shuffle).Doc("Visit training windows in a seeded random order."),

      FR_KEY(train, batch_size)
          .Min(1)
          .Doc("Sequences per optimizer step per data-parallel replica."),
      FR_KEY(train, seq_len).Min(1).Doc("Tokens per sequence; at most model.max_seq_len."),
      FR_KEY(train, microbatches)
          .Min(1)
          .Doc("Micro-batches per step (m); each holds batch_size / m sequences."),
      FR_KEY(train, steps).Min(0).Doc("Optimizer steps to run."),

      FR_KEY(optim, lr).Min(0, true).Doc("Peak learning rate."),
      FR_KEY(optim, beta1).Min(0).Max(1, true).Doc("AdamW first-moment decay."),
      FR_KEY(optim, beta2).Min(0).Max(1, true).Doc("AdamW second-moment decay."),
      FR_KEY(optim, eps).Min(0, true).Doc("AdamW epsilon."),
      FR_KEY(optim, weight_decay)
          .Min(0)
          .Doc("Decoupled weight decay on matrices (not on "
               "biases, LayerNorm or position embeddings)."),
      FR_KEY(optim, grad_clip)
          .Min(0)
          .Doc("Clip the global gradient norm to this; 0 turns "
               "clipping off."),
      FR_KEY(optim, warmup_steps).Min(0).Doc("Linear warm-up steps from 0 to lr."),
      FR_KEY(optim, schedule)
          .Choices({"cosine", "linear", "wsd", "constant"})
          .Doc("Learning-rate schedule after warm-up, to lr · min_lr_ratio at the last step: "
               "\"cosine\" (half a cosine), \"linear\", \"wsd\" (warmup-stable-decay: lr "
               "until the last decay_fraction of train.steps, then linear), or \"constant\" "
               "(lr throughout). Closed forms: docs/training.md#learning-rate-schedules."),
      FR_KEY(optim, min_lr_ratio)
          .Min(0)
          .Max(1)
          .Doc("Final learning rate of the cosine, linear and wsd schedules as a fraction of "
               "lr."),
      FR_KEY(optim, decay_fraction)
          .Min(0)
          .Max(1)
          .Doc("With schedule = \"wsd\": the fraction of train.steps, at the end, over which "
               "the learning rate decays."),
      FR_KEY(optim, reshape_schedule)
          .Doc("A resume whose train.steps differs from the checkpoint's is refused (exit 2) "
               "where that would change the learning rate from the step it resumes at; true "
               "lets it reshape the schedule to the new length."),
      FR_KEY(optim, on_nonfinite)
          .Choices({"stop", "skip"})
          .Doc("A step whose loss or gradient norm is NaN or infinite is never applied; then "
               "\"stop\" ends the run with an error, \"skip\" goes on with the next batch."),
      FR_KEY(optim, max_nonfinite_skips)
          .Min(1)
          .Doc("With on_nonfinite = \"skip\": this many non-finite steps in a row end the run."),
      FR_KEY(optim, step_sync)
          .Choices({"barrier", "post_validate"})
          .Doc("How a step ends. \"barrier\": every stage waits for the global gradient norm "
               "and non-finite check, then steps. \"post_validate\": each stage steps as soon "
               "as its own gradients are summed, keeping a copy of its parameters and AdamW "
               "moments, and goes on with the next step's first forwards; the global state, "
               "when it arrives, confirms the step or rolls it back and redoes it (clipped, or "
               "skipped when not finite). The same numbers either way; post_validate removes "
               "the wait for the slowest stage (zero-bubble schedules reach their papers' "
               "step time) for that memory and a copy per step. Default barrier: see "
               "docs/training.md."),

      FR_KEY(eval, every).Min(0).Doc("Validation loss every this many steps; 0 turns it off."),
      FR_KEY(eval, batches).Min(1).Doc("Validation batches per evaluation."),

      FR_KEY(checkpoint, every)
          .Min(0)
          .Doc("Write a checkpoint every this many steps; the final "
               "step always writes one."),
      FR_KEY(checkpoint, dir).Doc("Checkpoint directory; empty means run.dir/checkpoints."),
      FR_KEY(checkpoint, resume)
          .Doc("Resume training from a checkpoint directory (one written by "
               "this project), or \"latest\" for the newest one in "
               "checkpoint.dir; empty starts afresh."),
      FR_KEY(checkpoint, keep_last)
          .Min(0)
          .Doc("Keep only the newest this many checkpoints of checkpoint.dir (older step_N "
               "directories are removed once a new one is complete); 0 keeps every one."),
      FR_KEY(checkpoint, background)
          .Doc("Write the periodic checkpoints (checkpoint.every) from a snapshot in a thread "
               "while training goes on; the next checkpoint, a stop and the run's end wait for "
               "one still being written. The snapshot (a copy of the parameters and AdamW "
               "moments, as a synchronous checkpoint makes too) stays in host memory until it "
               "is written. false: training waits for each one."),

      FR_KEY(parallel, pp).Min(1).Max(4096).Doc("Pipeline stages."),
      FR_KEY(parallel, dp).Min(1).Max(4096).Doc("Data-parallel replicas; world size is pp × dp."),
      FR_KEY(parallel, schedule)
          .Choices({"gpipe", "1f1b", "interleaved", "zbh1", "zbh2", "zbv", "dualpipev", "file"})
          .Doc("Pipeline schedule; \"file\" trains parallel.schedule_file as it is."),
      FR_KEY(parallel, schedule_file)
          .Doc("A schedule in freeride's text or CSV form or torch.distributed.pipelining's CSV "
               "(for parallel.schedule = \"file\"); validated, completed and trained as is."),
      FR_KEY(parallel, chunks)
          .Min(1)
          .Max(64)
          .Doc("Model chunks per stage (v); ≥ 2 for interleaved; zbv and dualpipev run 2 (in a V); "
               "1 otherwise."),
      FR_KEY(parallel, partition)
          .Choices({"balanced", "even"})
          .Doc("How blocks are split over the model chunks: \"balanced\" minimises the costliest "
               "chunk, counting the embedding and the LM head by the FLOP model; \"even\" gives "
               "each the same number of blocks, and where they do not divide evenly the first "
               "chunks one more (train and config check warn: 3 blocks over 2 chunks are 2 + "
               "1). parallel.layers_per_stage overrides both."),
      FR_KEY(parallel, layers_per_stage)
          .Doc("Blocks in each of the pp × chunks model chunks, in pipeline order; must sum to "
               "model.n_layer. Empty: split by parallel.partition."),
      FR_KEY(parallel, recompute_stages)
          .Choices({"none", "selective", "full"})
          .Doc("model.recompute per pipeline stage, one entry per stage (parallel.pp entries, "
               "stage 0 first; a stage's chunks share its entry), e.g. [\"full\", "
               "\"selective\", \"none\", \"none\"]: in 1F1B the first stages hold the most "
               "micro-batches in flight. Empty: model.recompute on every stage."),
      FR_KEY(parallel, dp_bucket_mb)
          .Min(0)
          .Doc("With dp > 1: the data-parallel gradient sum in buckets of this many MiB, each "
               "started as soon as the step's last backward has made its gradients final "
               "(blocks from the last, then the embedding; the tied wte after its sum), so the "
               "sum overlaps the backward; REDUCE_GRADS waits for what is left. 0: one sum per "
               "model chunk after its last backward. Otherwise at least 1/256 (4 KiB: a bucket is "
               "a sum "
               "of its own, and tiny ones stall the step). The same bits either way "
               "(docs/training.md#data-parallel-buckets)."),
      FR_KEY(parallel, zero)
          .Min(0)
          .Max(1)
          .Doc("1: ZeRO-1 with dp > 1: each data-parallel rank of a stage keeps the AdamW "
               "moments of only its share (about 1/dp) of the stage's parameters; the "
               "gradient sum becomes a reduce-scatter in the buckets' layout "
               "(parallel.dp_bucket_mb; buckets of 4 MiB at 0), each rank steps its "
               "share, and an all-gather returns the parameters. The same bits as 0 "
               "(docs/training.md#zero-1-optimizer-sharding); checkpoints save each rank's "
               "share and resume under any dp, pp or zero. On runtime.device = \"cuda\" "
               "over NCCL the reduce-scatter and all-gather run in place on the device "
               "(one reduce or broadcast per rank's part), over MPI through host memory. No "
               "effect at dp = 1."),
      FR_KEY(parallel, zero_overlap)
          .Doc("With parallel.zero = 1: the all-gather of the parameters after each step's "
               "update is left in flight, and each model chunk waits for its own where the "
               "next step first reads it (its first forward; the wait counts as bubble time), "
               "so the gather overlaps the next batch's loading and the earlier stages' "
               "forwards. false: the step waits for the whole gather at its end, which measured "
               "faster where MPI ranks share CPU cores (bench/RESULTS.md). The same bits either "
               "way."),
      FR_KEY(parallel, transport)
          .Choices({"auto", "nccl", "mpi"})
          .Doc("What carries the activations and gradients between stages and the sums between "
               "ranks: \"nccl\" NCCL between GPUs (runtime.device = \"cuda\", one rank per "
               "GPU; MPI only starts it), \"mpi\" MPI through host memory, \"auto\" NCCL "
               "where every stage is on CUDA, the job has more than one rank and the build has "
               "NCCL (ZeRO-1 and post-validated steps included), else MPI. The start log says "
               "which carries what "
               "(docs/training.md#over-nccl)."),

      FR_KEY(runtime, device).Choices({"cpu", "cuda"}).Doc("Backend that runs the model."),
      FR_KEY(runtime, precision)
          .Choices({"fp32", "bf16"})
          .Doc("Weights and activations; bf16 keeps fp32 master weights (CUDA only)."),
      FR_KEY(runtime, fuse_gelu)
          .Choices({"auto", "on", "off"})
          .Doc("The MLP's GELU inside cuBLASLt's matmul epilogue (CUDA): \"auto\" fuses in bf16 "
               "only (fp32 runs it as its own kernel: cuBLASLt may have no fp32 GELU epilogue, "
               "and fp32 is held to the CPU within 1e-5); \"on\" fuses in both, \"off\" in "
               "neither."),
      FR_KEY(runtime, attention)
          .Choices({"auto", "reference"})
          .Doc("The causal attention on CUDA: \"auto\" runs the flash kernels (no T x T matrices; "
               "models/cuda/flash_attention.h) in bf16 where the head size is 16, 32, 64 or 128, "
               "and "
               "the reference path (batched GEMMs over T x T scores) in fp32 and for other shapes "
               "(both take Llama's grouped-query heads); \"reference\" always runs the reference "
               "path."),
      FR_KEY(runtime, kernels)
          .Choices({"auto", "reference"})
          .Doc("The memory-bound kernels on CUDA: \"auto\" runs the fused ones (16-byte "
               "vectors: LayerNorm with the residual add folded in and its backward in one pass, "
               "bias gradients as one two-pass column sum; a one-pass classifier, a multi-tensor "
               "optimizer) where the shape allows (C a multiple of 8 in bf16, 4 in fp32; C at "
               "most 2048 in bf16, 1024 in fp32); \"reference\" runs one kernel per operation "
               "(models/cuda/kernels.h), what the GPU tests and bench compare them with."),
      FR_KEY(runtime, gpu)
          .Min(-1)
          .Doc("The CUDA device of each rank; -1: the rank's node-local rank (Open MPI's "
               "OMPI_COMM_WORLD_LOCAL_RANK, Slurm's SLURM_LOCALID, LOCAL_RANK) modulo the "
               "devices it sees, one GPU per rank."),
      FR_KEY(runtime, comm_timeout_s)
          .Min(0, true)
          .Doc("Seconds a blocking communication may wait before the job stops with a report of "
               "what each rank was waiting for."),
      FR_KEY(runtime, emulate_peers)
          .Doc(
              "Run one stage (runtime.emulated_stage) for real in this one process and emulate the "
              "other stages' timing from their measured costs (docs/emulation.md)."),
      FR_KEY(runtime, emulated_stage)
          .Min(0)
          .Doc("With runtime.emulate_peers: the stage that runs for real."),
      FR_KEY(runtime, link_bandwidth_gbs)
          .Min(0, true)
          .Doc("With runtime.emulate_peers: bandwidth (GB/s) of the link between stages, for the "
               "emulated transfer time of an activation or gradient."),
      FR_KEY(runtime, threads).Min(0).Doc("CPU threads per rank; 0: the cores available."),
      FR_KEY(runtime, memory_fraction)
          .Min(0, true)
          .Max(1)
          .Doc("The share of the device's memory (the host's on the CPU, the GPU's on CUDA) that "
               "training and side work may use together: what a stage leaves to side tasks and "
               "fill jobs is this share less training's planned peak there (`freeride config "
               "memory` prints it per stage, the trainer logs it at start; "
               "docs/training.md#memory)."),
      FR_KEY(runtime, device_memory_mb)
          .Min(0)
          .Doc("The device's memory in MiB for that plan; 0: the machine's (the host's MemTotal, "
               "or its cgroup's memory.max, shared by the ranks on it, on the CPU; the GPU's "
               "total on CUDA). Set it to plan for another machine or to keep part of a shared "
               "one."),
      FR_KEY(runtime, peak_tflops)
          .Min(0)
          .Doc("Peak TFLOP/s of one rank's device, the denominator of metrics.jsonl's mfu. 0: "
               "the dense peak of a known GPU at runtime.precision (H100, H200, A100, L40S; "
               "another GPU has no mfu), on the CPU the run's own single-precision products "
               "measured at start. A step above 100% of it has no mfu (the peak is wrong)."),

      FR_KEY(freeride, enabled).Doc("Run the configured side tasks inside pipeline bubbles."),
      FR_KEY(freeride, alternate_every)
          .Min(0)
          .Doc(
              "Measure overhead in one run: harvest in blocks of this many steps, alternating with "
              "blocks without; 0 harvests every step."),
      FR_KEY(freeride, max_overhead)
          .Min(0)
          .Max(1)
          .Doc("The overhead budget: the share by which side work may lengthen training steps "
               "(0.01: 1%). With overhead_check on, side work backs off when the measured "
               "interval's lower bound is above it; strict, when its upper bound is "
               "(docs/side_tasks.md#the-overhead-budget)."),
      FR_KEY(freeride, overhead_check)
          .Choices({"on", "strict", "off"})
          .Doc("Keep the budget online: cycles of harvesting and plain blocks (alternate_every "
               "steps each; 0: 6 harvesting and 2 plain), the overhead of each harvesting block "
               "against its plain neighbours, and back-offs (shorter offers, fewer bubbles, the "
               "costliest task benched, paused) while it is over max_overhead, probing back up "
               "when it is not. On: backs off when the interval's lower bound is above the "
               "budget (harm shown). Strict: keeps a level only while the interval's upper bound "
               "is within it (harmlessness shown); on a noisy host it ends paused and says why. "
               "Off: side work runs in every step (or as alternate_every says)."),
      FR_KEY(freeride, calibration_steps)
          .Min(1)
          .Doc("Steps of each task run alone before training: their median starts the step-time "
               "prediction, their mean prices `reclaimed`."),
      FR_KEY(freeride, margin)
          .Min(0)
          .Max(1)
          .Doc(
              "Fraction of a bubble's predicted time kept free: a task step starts only if it fits "
              "in the rest."),
      FR_KEY(freeride, step_timeout_s)
          .Min(0.001)
          .Doc("A process-isolated task whose step (or create, or load) has run this long without "
               "finishing is hung: its worker is killed and the task FAILED."),
      FR_KEY(freeride, demote_after)
          .Min(1)
          .Doc("In-process steps that overrun their bubble (over twice their predicted time, past "
               "the "
               "bubble's end) before the task is demoted; twice as many fail it."),
      FR_KEY(freeride, serve_reserve)
          .Min(0)
          .Max(1)
          .Doc("Share of each predicted bubble kept for latency-sensitive tasks (serve) while "
               "their requests wait: throughput work (every other task, fill jobs included) "
               "does not start into it, and one that runs to a deadline stops at its start. 0: "
               "one predicted step of the serve task (docs/side_tasks.md#classes-of-side-work)."),
      FR_KEY(freeride, jobs)
          .Doc("Take fill jobs (`freeride submit RUN_DIR JOB.toml`) at step boundaries and run "
               "them in the bubbles they fit (docs/side_tasks.md#fill-jobs)."),
      FR_KEY(freeride, job_policy)
          .Choices({"fifo", "priority", "shortest_first"})
          .Doc("Which pending job is placed next: in submission order; the highest `priority` "
               "first (equals in submission order; lower ones may wait for ever); or the least "
               "estimated work first (`submit --work`; unknown last), except that a job pending "
               "longer than freeride.job_age_limit_s goes before every other."),
      FR_KEY(freeride, job_age_limit_s)
          .Min(0)
          .Doc("Under job_policy = \"shortest_first\": a job pending this long (wall-clock "
               "seconds since it was submitted) is placed before shorter ones, oldest first."),

      FR_KEY(trace, steps)
          .Doc("[first, last]: the steps timeline_rankNNN.json records (and the trace.json "
               "freeride report merges from them), at most 1000; each is kept in memory until "
               "the run ends."),
  };
}

}  // namespace

const std::vector<KeySpec>& Schema() {
  static const std::vector<KeySpec> schema = BuildSchema();
  return schema;
}

const std::vector<std::string>& SectionNames() {
  static const std::vector<std::string> names = {"run",     "model",    "data",       "train",
                                                 "optim",   "eval",     "checkpoint", "parallel",
                                                 "runtime", "freeride", "trace",      "side_tasks"};
  return names;
}

std::string SectionDoc(absl::string_view section) {
  if (section == "run") return "Where outputs go and how the run is seeded.";
  if (section == "model") return "GPT-2 architecture.";
  if (section == "data") return "Token shards to train and validate on.";
  if (section == "train") return "Batch shape and length of training.";
  if (section == "optim") return "AdamW, learning-rate schedule and gradient clipping.";
  if (section == "eval") return "Validation during training.";
  if (section == "checkpoint") return "Training-state checkpoints.";
  if (section == "parallel") return "Pipeline and data parallelism.";
  if (section == "runtime") return "Device, precision and communication.";
  if (section == "freeride") return "Side-task harvesting of pipeline bubbles.";
  if (section == "trace") return "The measured timeline of each rank.";
  if (section == "side_tasks") {
    return "Side tasks to run in bubbles: an array of tables, one `[[side_tasks]]` each.";
  }
  return "";
}

const std::vector<SideTaskKeyDoc>& SideTaskKeys() {
  static const std::vector<SideTaskKeyDoc> keys = {
      {"type", "string", "(required)", "Registered task type, e.g. `pagerank`, `image`."},
      {"name", "string", "the type", "Name in logs and reports; unique among side tasks."},
      {"stages", "list of integers or \"all\"", "\"all\"",
       "Pipeline stages whose bubbles run this task; each below parallel.pp."},
      {"priority", "integer", "0", "Higher-priority tasks are offered bubbles first."},
      {"memory_limit", "integer bytes or size string", "0",
       "Cap on the task's device memory, e.g. \"512MiB\"; 0: no cap beyond what is free."},
      {"plugin", "string (path)", "\"\"",
       "Shared object providing `type` (an out-of-tree task); empty for built-in tasks."},
      {"isolation", "\"process\" or \"inprocess\"", "process for plugins and `command`",
       "Where the task runs: its own worker process (paused at bubble ends; a crash, hang or "
       "memory overrun fails it alone) or the rank's process (the cheapest switch)."},
      {"repeat", "boolean", "false; true in `freeride study`",
       "Once the task is done, restart it on fresh input (a new seed, the next images) instead "
       "of finishing, so its bubbles stay used."},
      {"args", "table", "{}", "The task's own arguments, checked by the task at start."},
  };
  return keys;
}

std::string KeySpec::Expected() const {
  switch (type) {
    case KeyType::kBool:
      return "a boolean";
    case KeyType::kIntList:
      return "a list of integers";
    case KeyType::kStringList:
      if (choices.empty()) return "a list of strings";
      return absl::StrCat("a list of ",
                          absl::StrJoin(choices, ", ", [](std::string* out, const std::string& c) {
                            absl::StrAppend(out, "\"", c, "\"");
                          }));
    case KeyType::kString:
      if (choices.empty()) return "a string";
      return absl::StrCat("one of ",
                          absl::StrJoin(choices, ", ", [](std::string* out, const std::string& c) {
                            absl::StrAppend(out, "\"", c, "\"");
                          }));
    case KeyType::kInt:
    case KeyType::kFloat: {
      std::string text = type == KeyType::kInt ? "an integer" : "a number";
      auto bound = [&](double v) {
        return type == KeyType::kInt ? absl::StrCat(static_cast<int64_t>(v)) : TomlFloat(v);
      };
      if (min && max) {
        absl::StrAppend(&text, " in ", min_exclusive ? "(" : "[", bound(*min), ", ", bound(*max),
                        max_exclusive ? ")" : "]");
      } else if (min) {
        absl::StrAppend(&text, min_exclusive ? " > " : " >= ", bound(*min));
      } else if (max) {
        absl::StrAppend(&text, max_exclusive ? " < " : " <= ", bound(*max));
      }
      return text;
    }
  }
  return "";
}

std::string TomlString(absl::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {  // TOML escapes DEL too
          char buf[8];
          snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string TomlFloat(double value) {
  // Shortest text that reads back to the same double, always recognisable as a float.
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  std::string text(buf, end);
  if (text.find_first_of(".en") == std::string::npos) text += ".0";
  return text;
}

std::string FieldToToml(const KeySpec& spec, Config& config) {
  void* field = spec.field(config);
  switch (spec.type) {
    case KeyType::kInt:
      return absl::StrCat(*static_cast<int64_t*>(field));
    case KeyType::kFloat:
      return TomlFloat(*static_cast<double*>(field));
    case KeyType::kBool:
      return *static_cast<bool*>(field) ? "true" : "false";
    case KeyType::kString:
      return TomlString(*static_cast<std::string*>(field));
    case KeyType::kIntList:
      return absl::StrCat("[", absl::StrJoin(*static_cast<std::vector<int64_t>*>(field), ", "),
                          "]");
    case KeyType::kStringList:
      return absl::StrCat(
          "[",
          absl::StrJoin(*static_cast<std::vector<std::string>*>(field), ", ",
                        [](std::string* out, const std::string& s) { out->append(TomlString(s)); }),
          "]");
  }
  return "";
}

std::string Suggest(absl::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = 3;
  for (const std::string& candidate : candidates) {
    // Levenshtein distance with one rolling row.
    std::vector<size_t> row(candidate.size() + 1);
    for (size_t j = 0; j <= candidate.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= word.size(); ++i) {
      size_t diagonal = row[0];
      row[0] = i;
      for (size_t j = 1; j <= candidate.size(); ++j) {
        size_t up = row[j];
        row[j] = std::min(
            {row[j] + 1, row[j - 1] + 1, diagonal + (word[i - 1] == candidate[j - 1] ? 0 : 1)});
        diagonal = up;
      }
    }
    // A shortened or lengthened name ("optimizer" for "optim") counts as a near miss.
    const bool prefix = std::min(word.size(), candidate.size()) >= 3 &&
                        (absl::StartsWith(word, candidate) || absl::StartsWith(candidate, word));
    if (prefix && best_distance > 1) {
      best_distance = 1;
      best = candidate;
    } else if (row.back() < best_distance) {
      best_distance = row.back();
      best = candidate;
    }
  }
  return best;
}

}  // namespace freeride::config_internal
