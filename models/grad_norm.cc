#include "models/grad_norm.h"

#include "absl/strings/str_format.h"
#include "models/cpu/optimizer.h"

namespace freeride {

static_assert(kNormChunk == cpu::kSquaresChunk, "the norm's chunks are SumOfSquares's");

absl::StatusOr<ParamTensor> TensorAt(const ParamLayout& layout, const ParamRange& range) {
  for (const TensorSlot& slot : layout.slots) {
    if (slot.present && range.offset >= slot.offset &&
        range.offset + range.n <= slot.offset + slot.elements) {
      return slot.tensor;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("parameter elements [%d, %d) are not inside one tensor of the stage",
                      range.offset, range.offset + range.n));
}

NormPlan PlanGradNorm(const ParamLayout& layout) {
  const StageSpec& stage = layout.stage;
  NormPlan plan;
  auto add = [&](ParamTensor t, int64_t layer) {
    const TensorSlot& slot = layout.slot(t);
    if (!slot.present || slot.elements == 0) return;
    const int64_t per = IsPerLayer(t) ? ParamElements(layout.config, t) : slot.elements;
    plan.slices.push_back(
        {plan.units, t, slot.offset + (IsPerLayer(t) ? layer * per : 0), per, plan.chunks});
    plan.chunks += NormChunks(per);
  };
  if (stage.has_embedding) {
    add(ParamTensor::kWte, 0);
    add(ParamTensor::kWpe, 0);
    ++plan.units;
  }
  for (int64_t l = 0; l < stage.num_layers(); ++l) {
    for (int i = 0; i < kNumParamTensors; ++i) {
      if (IsPerLayer(static_cast<ParamTensor>(i))) add(static_cast<ParamTensor>(i), l);
    }
    ++plan.units;
  }
  if (stage.has_head) {
    // An untied head's matrix counts with the final norm (a tied one is the embedding's).
    add(ParamTensor::kLnfW, 0);
    add(ParamTensor::kLnfB, 0);
    add(ParamTensor::kLmHead, 0);
    ++plan.units;
  }
  return plan;
}

std::vector<double> UnitsFromChunkSquares(const NormPlan& plan, const double* partials) {
  std::vector<double> units(plan.units, 0.0);
  for (const NormSlice& slice : plan.slices) {
    double sum = 0;
    for (int64_t c = 0; c < NormChunks(slice.n); ++c) sum += partials[slice.first_chunk + c];
    units[slice.unit] += sum;
  }
  return units;
}

}  // namespace freeride
