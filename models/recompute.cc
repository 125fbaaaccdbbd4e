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

bool KeptPerSlot(Recompute mode, LayerTensorRole role) {
  switch (mode) {
    case Recompute::kNone:
      return true;
    case Recompute::kSelective:
      return role != LayerTensorRole::kProbabilities && role != LayerTensorRole::kMlpActivation;
    case Recompute::kFull:
      return role == LayerTensorRole::kBlockOutput;
  }
  return true;
}

int64_t RecomputeScratchElements(Recompute mode, LayerTensorRole role, int64_t per_layer,
                                 int64_t layers) {
  if (KeptPerSlot(mode, role)) return 0;
  if (mode == Recompute::kSelective) {
    return role == LayerTensorRole::kProbabilities ? per_layer : 0;
  }
  return (role == LayerTensorRole::kBlockOutputGrad ? layers - 1 : layers) * per_layer;
}

double RecomputeFlopsPerTokenPerBlock(const GPT2Config& config, int64_t seq_len, Recompute mode) {
  const double C = static_cast<double>(config.n_embd), T = static_cast<double>(seq_len);
  switch (mode) {
    case Recompute::kNone:
      return 0;
    case Recompute::kSelective:
      return 4 * T * C;
    case Recompute::kFull:
      // A block's F + B + W is three of its forwards (FlopPartCosts' split), either family.
      return FlopPartCosts(config, seq_len).block / 3;
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
