// The rules between a config's keys: what no single key's type or range can say (n_embd a
// multiple of n_head, chunks that fit the schedule, side tasks' names, the data files).
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/files.h"
#include "trainer/config/config_loader.h"

namespace freeride::config_internal {

void Loader::CheckCrossField(bool check_files) {
  const Config& c = config;
  // A rule reads its key, the keys its message names, and `reads`.
  auto fail = [&](const std::string& key, absl::string_view expected, absl::string_view found,
                  const std::vector<std::string>& reads = {}) {
    for (const std::string& bad : failed_) {
      if (bad == key || absl::StrContains(expected, bad) || absl::c_linear_search(reads, bad)) {
        return;
      }
    }
    Mismatch(OriginOf(key), key, expected, found);
  };
  if (check_files) {
    for (const auto& [key, pattern] :
         {std::pair{"data.train", c.data.train}, {"data.val", c.data.val}}) {
      if (!pattern.empty() && !GlobMatchesAFile(pattern)) {
        fail(key, "a file, or a glob matching one (relative to the working directory)",
             TomlString(pattern));
      }
    }
  }
  if (c.model.n_embd % c.model.n_head != 0) {
    fail("model.n_embd", absl::StrCat("a multiple of model.n_head (", c.model.n_head, ")"),
         absl::StrCat(c.model.n_embd));
  }
  if (c.model.arch == "llama") {
    const int64_t kv = c.model.n_kv_head == 0 ? c.model.n_head : c.model.n_kv_head;
    if (c.model.n_head % kv != 0) {
      fail("model.n_kv_head", absl::StrCat("a divisor of model.n_head (", c.model.n_head, ")"),
           absl::StrCat(c.model.n_kv_head));
    }
    if (c.model.n_embd % c.model.n_head == 0 && (c.model.n_embd / c.model.n_head) % 2 != 0) {
      fail("model.n_embd",
           absl::StrCat("an even head size for rotary embeddings (model.n_embd / model.n_head = ",
                        c.model.n_embd / c.model.n_head, ")"),
           absl::StrCat(c.model.n_embd), {"model.n_head"});
    }
  } else {
    if (c.model.n_kv_head != 0 && c.model.n_kv_head != c.model.n_head) {
      fail("model.n_kv_head",
           "0 or model.n_head for model.arch = \"gpt2\" (grouped-query "
           "attention is the llama family's)",
           absl::StrCat(c.model.n_kv_head), {"model.arch"});
    }
    if (!c.model.tie_embeddings) {
      fail("model.tie_embeddings", "true for model.arch = \"gpt2\" (GPT-2's head is tied)", "false",
           {"model.arch"});
    }
  }
  if (c.train.seq_len > c.model.max_seq_len) {
    fail("train.seq_len", absl::StrCat("at most model.max_seq_len (", c.model.max_seq_len, ")"),
         absl::StrCat(c.train.seq_len));
  }
  if (c.train.batch_size % c.train.microbatches != 0) {
    fail("train.batch_size",
         absl::StrCat("a multiple of train.microbatches (", c.train.microbatches, ")"),
         absl::StrCat(c.train.batch_size));
  }
  // Each bucket is a sum of its own: below a few thousand floats the sums' latency, not their
  // bytes, is the step (1e-7 MiB made one-float buckets, and no step in 70 s at dp 2).
  if (c.parallel.dp_bucket_mb > 0 && c.parallel.dp_bucket_mb < kMinDpBucketMb) {
    fail("parallel.dp_bucket_mb",
         absl::StrFormat("0 (one sum per model chunk) or at least %g (4 KiB: buckets of 1024 "
                         "floats or more)",
                         kMinDpBucketMb),
         absl::StrFormat("%g", c.parallel.dp_bucket_mb));
  }
  const std::string& kind = c.parallel.schedule;
  const std::vector<std::string> split = {"parallel.schedule", "parallel.chunks", "parallel.pp"};
  const bool interleaved = kind == "interleaved", v_shaped = kind == "zbv" || kind == "dualpipev";
  int64_t chunks = c.parallel.chunks;  // per stage, as the schedule will run them
  if (interleaved && c.parallel.chunks < 2) {
    fail("parallel.chunks", "at least 2 for the interleaved schedule",
         absl::StrCat(c.parallel.chunks), split);
  } else if (v_shaped && c.parallel.chunks > 2) {
    fail("parallel.chunks", absl::StrCat("1 or 2 for the ", kind, " schedule (it runs 2)"),
         absl::StrCat(c.parallel.chunks), split);
  } else if (!interleaved && !v_shaped && kind != "file" && c.parallel.chunks != 1) {
    fail("parallel.chunks", absl::StrCat("1 for the ", kind, " schedule"),
         absl::StrCat(c.parallel.chunks), split);
  }
  if (v_shaped) chunks = 2;
  if (kind == "file" && c.parallel.schedule_file.empty()) {
    fail("parallel.schedule_file", "a schedule file for parallel.schedule = \"file\"", "\"\"");
  } else if (kind != "file" && !c.parallel.schedule_file.empty()) {
    fail("parallel.schedule_file",
         absl::StrCat("empty unless parallel.schedule = \"file\" (it is \"", kind, "\")"),
         absl::StrCat("\"", c.parallel.schedule_file, "\""));
  }
  if (kind == "dualpipev" && c.train.microbatches < 2 * c.parallel.pp) {
    fail("train.microbatches",
         absl::StrCat("at least 2 × parallel.pp (", 2 * c.parallel.pp, ") for dualpipev"),
         absl::StrCat(c.train.microbatches), split);
  }
  const int64_t model_chunks = c.parallel.pp * chunks;
  if (model_chunks > c.model.n_layer) {
    fail("parallel.pp",
         absl::StrCat("at most model.n_layer (", c.model.n_layer,
                      ") model chunks, found pp × "
                      "chunks = ",
                      model_chunks, "; at most ", c.model.n_layer / chunks, " stages fit"),
         absl::StrCat(c.parallel.pp), split);
  }
  if (!c.parallel.layers_per_stage.empty()) {
    int64_t sum = 0;
    bool positive = true;
    for (int64_t n : c.parallel.layers_per_stage) {
      sum += n;
      positive = positive && n >= 1;
    }
    if (static_cast<int64_t>(c.parallel.layers_per_stage.size()) != model_chunks || !positive ||
        sum != c.model.n_layer) {
      fail("parallel.layers_per_stage",
           absl::StrCat(model_chunks, " positive counts (pp × chunks) summing to model.n_layer (",
                        c.model.n_layer, ")"),
           absl::StrCat("[", absl::StrJoin(c.parallel.layers_per_stage, ", "), "] (",
                        c.parallel.layers_per_stage.size(), " entries, sum ", sum, ")"),
           split);
    }
  }
  if (!c.parallel.recompute_stages.empty() &&
      static_cast<int64_t>(c.parallel.recompute_stages.size()) != c.parallel.pp) {
    fail("parallel.recompute_stages",
         absl::StrCat("one entry per pipeline stage (parallel.pp = ", c.parallel.pp,
                      "), or empty for model.recompute on every stage"),
         absl::StrCat(c.parallel.recompute_stages.size(), " entries"));
  }
  const std::vector<int64_t>& trace = c.trace.steps;
  if (trace.size() != 2 || trace[0] < 1 || trace[1] < trace[0] || trace[1] - trace[0] >= 1000) {
    fail("trace.steps", "[first, last] with 1 <= first <= last and at most 1000 steps",
         absl::StrCat("[", absl::StrJoin(trace, ", "), "]"));
  }
  if (c.runtime.precision == "bf16" && c.runtime.device != "cuda") {
    fail("runtime.precision", "\"fp32\" on the cpu device (bf16 needs runtime.device = \"cuda\")",
         "\"bf16\"");
  }
  if (c.eval.every > 0 && c.data.val.empty()) {
    fail("eval.every", "0 when data.val is empty (there is nothing to validate on)",
         absl::StrCat(c.eval.every));
  }
  std::map<std::string, size_t> names;
  for (size_t i = 0; i < c.side_tasks.size(); ++i) {
    const SideTaskConfig& task = c.side_tasks[i];
    const std::string name = task.name.empty() ? task.type : task.name;
    const std::string at = absl::StrCat("side_tasks[", i, "]");
    const std::vector<std::string> own = {at + ".type", at + ".name", at + ".plugin"};
    // A task's name names its files and directories in run.dir (`<name>_r<rank>`): one that
    // is not a plain file name would put them elsewhere.
    if (!IsPlainName(name)) {
      fail(absl::StrCat("side_tasks[", i, task.name.empty() ? "].type" : "].name"),
           "a name of letters, digits, '_', '-' and '.', not starting with '.' or '-', at most "
           "64 characters (it names files in run.dir)",
           TomlString(name), own);
    }
    if (auto [it, inserted] = names.emplace(name, i); !inserted) {
      fail(absl::StrCat("side_tasks[", i, "].name"),
           absl::StrCat("a name not already used by side_tasks[", it->second, "]"),
           TomlString(name), own);
    }
    if (task.isolation == "inprocess" && task.type == "command" && task.plugin.empty()) {
      fail(absl::StrCat("side_tasks[", i, "].isolation"),
           "\"process\" for a `command` task (its program always runs as its own process)",
           "\"inprocess\"", own);
    }
    for (int64_t stage : task.stages) {
      if (stage >= c.parallel.pp) {
        fail(absl::StrCat("side_tasks[", i, "].stages"),
             absl::StrCat("stage numbers below parallel.pp (", c.parallel.pp, ")"),
             absl::StrCat(stage));
        break;
      }
    }
  }
}

}  // namespace freeride::config_internal
