#include "models/recompute.h"

#include "absl/strings/str_cat.h"

namespace freeride {

absl::StatusOr<Recompute> ParseRecompute(absl::string_view name) {
  if (name == "none") return Recompute::kNone;
  if (name == "selective") return Recompute::kSelective;
  if (name == "full") return Recompute::kFull;
  return absl::InvalidArgumentError(
      absl::StrCat("recompute \"", name, "\": expected \"none\", \"selective\" or \"full\""));
}

const char* RecomputeName(Recompute mode) {
  switch (mode) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

double RecomputeFlopsPerTokenPerBlock(const GPT2Config& config, int64_t seq_len, Recompute mode) {
  const double C = static_cast<double>(config.n_embd), T = static_cast<double>(seq_len);
  switch (mode) {
    case Recompute::kNone:
      return 0;
    case Recompute::kSelective:
      return 4 * T * C;
    case Recompute::kFull:
      return 24 * C * C + 4 * T * C;
  }
  return 0;
}

double CudaRecomputeFlopsPerTokenPerBlock(const GPT2Config& config, int64_t seq_len, Recompute mode,
                                          bool gelu_in_product) {
  if (mode != Recompute::kSelective) return RecomputeFlopsPerTokenPerBlock(config, seq_len, mode);
  const double C = static_cast<double>(config.n_embd);
  return gelu_in_product ? 8 * C * C : 0;
}

}  // namespace freeride
