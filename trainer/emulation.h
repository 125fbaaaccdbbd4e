// Emulated pipeline peers (runtime.emulate_peers): the cost model the emulator times the
// other stages with, measured on this device by running every stage's layers once.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "models/backend.h"
#include "models/gpt2_config.h"
#include "pipeline/cost_model.h"
#include "pipeline/schedule.h"

namespace freeride {

// Per stage of `pp`: F, B (input gradient) and W (weight gradient) of one micro-batch, in ms,
// each the fastest of a few timed runs of the real layers on `backend`; `comm` the transfer of
// one activation message (in MessageTypeOf(backend)) over a link of `link_gbs` GB/s. `stages`
// lists the virtual stages (pp × chunks, on the stages `placement` puts them on); a stage's
// cost is the sum of its chunks', and with several chunks each one's own cost is kept too
// (CostModel::chunks). `recompute` (per stage of `pp`, or empty: backend's): what each
// stage's chunks recompute, so that their B includes it.
absl::StatusOr<pipeline::CostModel> CalibrateStageCosts(
    const BackendOptions& backend, const GPT2Config& config, const std::vector<StageSpec>& stages,
    int pp, pipeline::Placement placement, int64_t micro_batch, int64_t seq_len, double link_gbs,
    uint64_t seed, const std::vector<Recompute>& recompute = {});

// The training cost (F + B + W, ms) of the embedding, one block and the head on `backend`,
// from three probe stages timed as CalibrateStageCosts times stages: [embedding + block],
// [block], [block + head]. What the balanced partition weighs the model's parts by.
absl::StatusOr<PartCosts> MeasurePartCosts(const BackendOptions& backend,
                                           const GPT2Config& config, int64_t micro_batch,
                                           int64_t seq_len, uint64_t seed);

// The parts' costs (ms, F + B + W of one micro-batch) on simulated time: the FLOP model
// (FlopPartCosts) at kSimulatedFlopsPerSecond. Deterministic where the measured ones are not;
// a run on a simulated clock takes these instead of timing its layers.
inline constexpr double kSimulatedFlopsPerSecond = 1e10;
PartCosts SimulatedPartCosts(const GPT2Config& config, int64_t micro_batch, int64_t seq_len);

// Milliseconds per parameter of one optimizer step (the gradient norm's squares and the AdamW
// update, gradient scaling included) on `backend`, the fastest of a few timed steps of one
// transformer block and the head.
absl::StatusOr<double> MeasureOptimizerMsPerParam(const BackendOptions& backend,
                                                  const GPT2Config& config, int64_t micro_batch,
                                                  int64_t seq_len, uint64_t seed);

}  // namespace freeride
