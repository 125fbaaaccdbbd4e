#include "pipeline/cost_model.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace freeride::pipeline {

absl::StatusOr<CostModel> ParseCostSpec(absl::string_view spec) {
  CostModel model = CostModel::Uniform();
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, '=');
    absl::string_view key = absl::StripAsciiWhitespace(kv.first);
    double value = 0;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(kv.second), &value) ||
        !std::isfinite(value) || value < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cost '", item, "': expected key=milliseconds with a number >= 0"));
    }
    if (key == "f") model.stages[0].f = value;
    else if (key == "b") model.stages[0].b = value;
    else if (key == "w") model.stages[0].w = value;
    else if (key == "comm") model.comm = value;
    else if (key == "reduce") model.reduce = value;
    else if (key == "tied") model.tied = value;
    else if (key == "opt") model.optimizer = value;
    else if (key == "buckets" && value == std::floor(value) && value <= 1e6) {
      model.reduce_buckets = static_cast<int>(value);
    } else if (key == "buckets") {
      return absl::InvalidArgumentError(
          absl::StrCat("cost '", item, "': buckets is a whole number of buckets per chunk"));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("cost '", item, "': unknown key '", key,
                       "'; expected f, b, w, comm, reduce, tied, opt or buckets"));
    }
  }
  return model;
}

absl::Status CheckCostModel(const CostModel& model, int stages, int chunks) {
  if (model.stages.size() != 1 && static_cast<int>(model.stages.size()) != stages) {
    return absl::InvalidArgumentError(absl::StrCat("cost model has ", model.stages.size(),
                                                   " stage entries; expected 1 or ", stages));
  }
  if (!model.chunks.empty() && static_cast<int>(model.chunks.size()) != stages * chunks) {
    return absl::InvalidArgumentError(absl::StrCat("cost model has ", model.chunks.size(),
                                                   " chunk entries; expected ", stages * chunks,
                                                   " (stages × chunks) or none"));
  }
  auto bad = [](double v) { return !std::isfinite(v) || v < 0; };
  for (size_t s = 0; s < model.stages.size(); ++s) {
    const StageCost& c = model.stages[s];
    if (bad(c.f) || bad(c.b) || bad(c.w)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cost of stage ", s, " has a negative or non-finite time"));
    }
    if (c.f + c.b + c.w <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cost of stage ", s, " is zero; some computation must take time"));
    }
  }
  for (size_t k = 0; k < model.chunks.size(); ++k) {
    const StageCost& c = model.chunks[k];
    if (bad(c.f) || bad(c.b) || bad(c.w)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cost of virtual stage ", k, " has a negative or non-finite time"));
    }
  }
  if (bad(model.comm) || bad(model.reduce) || bad(model.Tied()) || bad(model.optimizer)) {
    return absl::InvalidArgumentError("comm, reduce, tied and opt costs must be finite and >= 0");
  }
  if (model.reduce_buckets < 0) {
    return absl::InvalidArgumentError("reduce_buckets must be >= 0");
  }
  return absl::OkStatus();
}

std::string FormatCostModel(const CostModel& model) {
  std::string out;
  for (size_t s = 0; s < model.stages.size(); ++s) {
    const StageCost& c = model.stages[s];
    absl::StrAppend(&out, model.stages.size() == 1 ? "" : absl::StrCat("stage", s, " "),
                    absl::StrFormat("f=%g b=%g w=%g; ", c.f, c.b, c.w));
  }
  absl::StrAppend(
      &out, absl::StrFormat("comm=%g reduce=%g ", model.comm, model.reduce),
      model.reduce_buckets > 0 ? absl::StrFormat("buckets=%d ", model.reduce_buckets) : "",
      model.tied ? absl::StrFormat("tied=%g ", *model.tied) : "",
      absl::StrFormat("opt=%g (ms)", model.optimizer));
  return out;
}

}  // namespace freeride::pipeline
