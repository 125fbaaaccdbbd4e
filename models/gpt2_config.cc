#include "models/gpt2_config.h"

#include <algorithm>
#include <functional>
#include <limits>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace freeride {

int64_t PadVocab(int64_t vocab_size) { return (vocab_size + 127) / 128 * 128; }

const char* ModelArchName(ModelArch arch) { return arch == ModelArch::kLlama ? "llama" : "gpt2"; }

absl::Status ValidateGPT2Config(const GPT2Config& c) {
  if (c.n_layer < 1 || c.n_head < 1 || c.n_embd < 1 || c.max_seq_len < 1 || c.vocab_size < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model shape must be positive: n_layer=%d n_head=%d n_embd=%d max_seq_len=%d "
        "vocab_size=%d",
        c.n_layer, c.n_head, c.n_embd, c.max_seq_len, c.vocab_size));
  }
  if (c.n_embd % c.n_head != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model.n_head (%d) must divide model.n_embd (%d)", c.n_head, c.n_embd));
  }
  if (c.is_llama()) {
    if (c.n_kv_head < 1 || c.n_head % c.n_kv_head != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("model.n_kv_head (%d) must be at least 1 and divide model.n_head (%d)",
                          c.n_kv_head, c.n_head));
    }
    if ((c.n_embd / c.n_head) % 2 != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("model.arch = \"llama\" needs an even head size for rotary embeddings: "
                          "model.n_embd / model.n_head = %d",
                          c.n_embd / c.n_head));
    }
    if (c.ffn_hidden < 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("model.ffn_hidden (%d) must be positive", c.ffn_hidden));
    }
    if (!(c.rope_theta > 0)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("model.rope_theta (%g) must be positive", c.rope_theta));
    }
    if (!(c.norm_eps > 0)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("model.norm_eps (%g) must be positive", c.norm_eps));
    }
  }
  if (c.padded_vocab_size < c.vocab_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "padded vocabulary %d is smaller than the vocabulary %d", c.padded_vocab_size,
        c.vocab_size));
  }
  return absl::OkStatus();
}

absl::StatusOr<GPT2Config> MakeGPT2Config(int64_t n_layer, int64_t n_head, int64_t n_embd,
                                          int64_t max_seq_len, int64_t vocab_size) {
  GPT2Config c{max_seq_len, vocab_size, PadVocab(vocab_size), n_layer, n_head, n_embd};
  if (absl::Status s = ValidateGPT2Config(c); !s.ok()) return s;
  return c;
}

int64_t LlamaFfnHidden(int64_t n_embd, double multiplier, int64_t multiple_of) {
  const int64_t hidden = static_cast<int64_t>(multiplier * static_cast<double>(2 * 4 * n_embd / 3));
  return (hidden + multiple_of - 1) / multiple_of * multiple_of;
}

absl::StatusOr<GPT2Config> MakeLlamaConfig(int64_t n_layer, int64_t n_head, int64_t n_kv_head,
                                           int64_t n_embd, int64_t max_seq_len, int64_t vocab_size,
                                           int64_t ffn_hidden, double rope_theta, double norm_eps,
                                           bool tie_embeddings) {
  GPT2Config c{max_seq_len, vocab_size, PadVocab(vocab_size), n_layer, n_head, n_embd};
  c.arch = ModelArch::kLlama;
  c.n_kv_head = n_kv_head;
  c.ffn_hidden = ffn_hidden;
  c.rope_theta = rope_theta;
  c.norm_eps = norm_eps;
  c.tie_embeddings = tie_embeddings;
  if (absl::Status s = ValidateGPT2Config(c); !s.ok()) return s;
  return c;
}

const char* ParamTensorName(ParamTensor t) {
  static const char* kNames[kNumParamTensors] = {
      "wte",  "wpe", "ln1w", "ln1b",    "qkvw",    "qkvb", "attprojw", "attprojb", "ln2w",
      "ln2b", "fcw", "fcb",  "fcprojw", "fcprojb", "lnfw", "lnfb",     "lmhead"};
  return kNames[static_cast<int>(t)];
}

bool IsPerLayer(ParamTensor t) {
  return t != ParamTensor::kWte && t != ParamTensor::kWpe && t != ParamTensor::kLnfW &&
         t != ParamTensor::kLnfB && t != ParamTensor::kLmHead;
}

bool IsDecayed(ParamTensor t) {
  switch (t) {
    case ParamTensor::kWte: case ParamTensor::kWpe: case ParamTensor::kQkvW:
    case ParamTensor::kAttProjW: case ParamTensor::kFcW: case ParamTensor::kFcProjW:
    case ParamTensor::kLmHead:
      return true;
    default:
      return false;
  }
}

namespace {

int64_t LlamaParamElements(const GPT2Config& c, ParamTensor t) {
  const int64_t C = c.n_embd, F = c.ffn_hidden;
  switch (t) {
    case ParamTensor::kWte:
      return c.padded_vocab_size * C;
    case ParamTensor::kLmHead:
      return c.tie_embeddings ? 0 : c.padded_vocab_size * C;
    case ParamTensor::kLn1W:
    case ParamTensor::kLn2W:
    case ParamTensor::kLnfW:
      return C;
    case ParamTensor::kQkvW:
      return (C + 2 * c.kv_dim()) * C;
    case ParamTensor::kAttProjW:
      return C * C;
    case ParamTensor::kFcW:
      return 2 * F * C;
    case ParamTensor::kFcProjW:
      return C * F;
    default:
      return 0;  // wpe and every bias
  }
}

}  // namespace

int64_t ParamElements(const GPT2Config& c, ParamTensor t) {
  if (c.is_llama()) return LlamaParamElements(c, t);
  const int64_t C = c.n_embd;
  switch (t) {
    case ParamTensor::kWte: return c.padded_vocab_size * C;
    case ParamTensor::kWpe: return c.max_seq_len * C;
    case ParamTensor::kLn1W: case ParamTensor::kLn1B: case ParamTensor::kLn2W:
    case ParamTensor::kLn2B: case ParamTensor::kAttProjB: case ParamTensor::kFcProjB:
    case ParamTensor::kLnfW: case ParamTensor::kLnfB:
      return C;
    case ParamTensor::kQkvW: return 3 * C * C;
    case ParamTensor::kQkvB: return 3 * C;
    case ParamTensor::kAttProjW: return C * C;
    case ParamTensor::kFcW: case ParamTensor::kFcProjW: return 4 * C * C;
    case ParamTensor::kFcB: return 4 * C;
    case ParamTensor::kLmHead:
      return 0;
  }
  return 0;
}

int64_t TiedElements(const GPT2Config& c) {
  return c.is_llama() && !c.tie_embeddings ? 0 : c.padded_vocab_size * c.n_embd;
}

StageSpec WholeModel(const GPT2Config& config) { return {0, config.n_layer, true, true}; }

absl::StatusOr<std::vector<StageSpec>> SplitIntoStages(
    const GPT2Config& config, int64_t stages, const std::vector<int64_t>& layers_per_stage) {
  if (stages < 1) return absl::InvalidArgumentError("pipeline stages must be at least 1");
  if (stages > config.n_layer) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d pipeline stages but the model has only %d layers: at most %d stages fit", stages,
        config.n_layer, config.n_layer));
  }
  std::vector<int64_t> counts = layers_per_stage;
  if (counts.empty()) {
    for (int64_t s = 0; s < stages; ++s) {
      counts.push_back(config.n_layer / stages + (s < config.n_layer % stages ? 1 : 0));
    }
  }
  int64_t sum = 0;
  for (int64_t n : counts) sum += n;
  if (static_cast<int64_t>(counts.size()) != stages || sum != config.n_layer ||
      std::find_if(counts.begin(), counts.end(), [](int64_t n) { return n < 1; }) !=
          counts.end()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "parallel.layers_per_stage = [%s] must list %d positive counts summing to n_layer = %d",
        absl::StrJoin(counts, ", "), stages, config.n_layer));
  }
  std::vector<StageSpec> specs;
  int64_t first = 0;
  for (int64_t s = 0; s < stages; ++s) {
    specs.push_back({first, first + counts[s], s == 0, s == stages - 1});
    first += counts[s];
  }
  return specs;
}

namespace {

// A block's matrix-product parameters (GPT-2: 12·C²).
double BlockMatmulParams(const GPT2Config& c) {
  const double C = static_cast<double>(c.n_embd);
  if (!c.is_llama()) return 12.0 * C * C;
  return C * (C + 2.0 * static_cast<double>(c.kv_dim())) + C * C +
         3.0 * C * static_cast<double>(c.ffn_hidden);
}

}  // namespace

PartCosts FlopPartCosts(const GPT2Config& config, int64_t seq_len) {
  const double C = static_cast<double>(config.n_embd), T = static_cast<double>(seq_len);
  PartCosts costs;
  costs.embedding = 3 * 2 * C;
  costs.block = config.is_llama() ? 3 * (2 * BlockMatmulParams(config) + 4 * T * C)
                                  : 3 * (24 * C * C + 4 * T * C);
  costs.head = 3 * 2 * C * static_cast<double>(config.padded_vocab_size);
  return costs;
}

namespace {

// Every split of L blocks into `stages` pieces of at least one, when there are at most `limit`.
bool EnumerateSplits(int64_t L, int64_t stages, int64_t limit,
                     const std::function<void(const std::vector<int64_t>&)>& visit) {
  double count = 1;  // C(L-1, stages-1)
  for (int64_t i = 1; i < stages; ++i) count = count * static_cast<double>(L - i) / i;
  if (count > static_cast<double>(limit)) return false;
  std::vector<int64_t> counts(stages, 1);
  std::function<void(int64_t, int64_t)> fill = [&](int64_t k, int64_t left) {
    if (k == stages - 1) {
      counts[k] = left;
      visit(counts);
      return;
    }
    for (int64_t take = 1; take <= left - (stages - k - 1); ++take) {
      counts[k] = take;
      fill(k + 1, left - take);
    }
  };
  fill(0, L);
  return true;
}

}  // namespace

absl::StatusOr<std::vector<StageSpec>> BalancedStages(const GPT2Config& config, int64_t stages,
                                                      const PartCosts& costs,
                                                      const std::vector<int>& owners) {
  const int64_t L = config.n_layer;
  if (stages < 1 || stages > L) return SplitIntoStages(config, stages, {});  // its error
  auto piece = [&](int64_t k, int64_t blocks) {
    return blocks * costs.block + (k == 0 ? costs.embedding : 0.0) +
           (k == stages - 1 ? costs.head : 0.0);
  };
  if (static_cast<int64_t>(owners.size()) == stages) {
    const int ranks = *std::max_element(owners.begin(), owners.end()) + 1;
    std::pair<double, double> best{std::numeric_limits<double>::infinity(), 0};
    std::vector<int64_t> chosen;
    const bool searched = EnumerateSplits(L, stages, 200000, [&](const std::vector<int64_t>& c) {
      std::vector<double> rank(ranks, 0.0);
      double spread = 0;  // ties on the costliest rank: the evenest split (least sum of squares)
      for (int64_t k = 0; k < stages; ++k) rank[owners[k]] += piece(k, c[k]);
      for (double r : rank) spread += r * r;
      const std::pair<double, double> score{*std::max_element(rank.begin(), rank.end()), spread};
      if (score.first < best.first * (1 - 1e-12) ||
          (score.first <= best.first * (1 + 1e-12) && score.second < best.second * (1 - 1e-12))) {
        best = score;
        chosen = c;
      }
    });
    if (searched) return SplitIntoStages(config, stages, chosen);
  }
  // worst[k][l]: the smallest possible costliest piece when pieces k.. take the last l blocks.
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> worst(stages + 1, std::vector<double>(L + 1, kInf));
  worst[stages][0] = 0;
  for (int64_t k = stages - 1; k >= 0; --k) {
    for (int64_t l = 1; l <= L; ++l) {
      for (int64_t take = 1; take <= l; ++take) {
        worst[k][l] = std::min(worst[k][l], std::max(piece(k, take), worst[k + 1][l - take]));
      }
    }
  }
  std::vector<int64_t> counts;
  int64_t left = L;
  for (int64_t k = 0; k < stages; ++k) {
    // The most blocks this piece can take without raising the optimum.
    int64_t take = 1;
    for (int64_t t = left - (stages - k - 1); t >= 1; --t) {
      if (std::max(piece(k, t), worst[k + 1][left - t]) <= worst[0][L] * (1 + 1e-12)) {
        take = t;
        break;
      }
    }
    counts.push_back(take);
    left -= take;
  }
  return SplitIntoStages(config, stages, counts);
}

ParamLayout MakeParamLayout(const GPT2Config& config, const StageSpec& stage) {
  ParamLayout layout;
  layout.config = config;
  layout.stage = stage;
  int64_t offset = 0;
  for (int i = 0; i < kNumParamTensors; ++i) {
    const ParamTensor t = static_cast<ParamTensor>(i);
    bool present = false;
    int64_t elements = ParamElements(config, t);
    if (t == ParamTensor::kWte) {
      // The head's stage holds wte too when the head is tied to it.
      present = stage.has_embedding || (stage.has_head && TiedElements(config) > 0);
    } else if (t == ParamTensor::kWpe) {
      present = stage.has_embedding;
    } else if (t == ParamTensor::kLnfW || t == ParamTensor::kLnfB || t == ParamTensor::kLmHead) {
      present = stage.has_head;
    } else {
      present = stage.num_layers() > 0;
      elements *= stage.num_layers();
    }
    if (elements == 0) present = false;  // a tensor this family does not have
    layout.slots[i] = {t, offset, present ? elements : 0, present};
    if (present) offset += elements;
  }
  layout.total = offset;
  return layout;
}

int64_t NumParameters(const GPT2Config& config) {
  return MakeParamLayout(config, WholeModel(config)).total;
}

double TrainingFlopsPerToken(const GPT2Config& c, int64_t seq_len) {
  const double C = static_cast<double>(c.n_embd);
  const double matmul_params = static_cast<double>(c.n_layer) * BlockMatmulParams(c) +
                               static_cast<double>(c.padded_vocab_size) * C;
  return 6.0 * matmul_params + 12.0 * static_cast<double>(c.n_layer) * C * seq_len;
}

}  // namespace freeride
