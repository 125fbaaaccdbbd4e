// Trainer::Create's phases, in the order it runs them, each a function of what the ones before
// it made, so that each is tested on its own (tests/trainer/trainer_setup_test.cc):
//   1. the rank: where this rank sits in the pp × dp grid, the world checked against it;
//   2. the model config: the shape the config (or model.init_from) asks for, and the run's
//      sequence length checked against its context;
//   3. the part costs: what the balanced split weighs the embedding, a block and the head by
//      (none for an even split; the FLOP model on simulated time; else measured here and
//      averaged over every rank, so that all split alike);
//   4. the pipeline plan: the split into chunks, the schedule with its costs (the emulated
//      peers' measured ones) and, on simulated time, what each instruction takes;
//   5. the transport: the one given, a world of one, or the emulated peers;
//   6. the stage models: this rank's chunks, initialised (model.init_from's slices, or seeded);
//   7. the executors: the training schedule's and the validation's forward-only one.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/clock.h"
#include "models/backend.h"
#include "models/gpt2_config.h"
#include "pipeline/comm/transport.h"
#include "pipeline/cost_model.h"
#include "pipeline/stage_executor.h"
#include "trainer/config/config.h"
#include "trainer/pipeline_plan.h"

namespace freeride {

// 1. This rank's place: pp and dp from the config, its stage and replica from `rank` (an
// emulated-peers run plays runtime.emulated_stage of replica 0); chunks come with the plan.
// `transport` is the one Trainer::Create was given (null: one process): an emulated-peers run
// takes none, and any other world must be pp × dp ranks.
absl::StatusOr<pipeline::RankLayout> RankPhase(const Config& config,
                                               const pipeline::Transport* transport);

// 2. The model's shape (ResolveModelConfig), with train.seq_len within its max_seq_len.
absl::StatusOr<GPT2Config> ModelPhase(const Config& config);

// 3. The part costs the split needs (nullopt when it needs none). Measured costs are summed
// over every rank of `transport` (collective; null or one rank: this rank's own).
absl::StatusOr<std::optional<PartCosts>> PartCostsPhase(
    const Config& config, const GPT2Config& model, const BackendOptions& backend,
    const pipeline::RankLayout& layout, pipeline::Transport* transport, bool simulated);

struct PipelineSetup {
  PipelinePlan plan;
  pipeline::Schedule schedule;
  // The costs the schedule's bubbles were placed with: the emulated peers', the measured part
  // costs' (a split that measured them), else uniform.
  pipeline::CostModel cost = pipeline::CostModel::Uniform();
  // Whether `cost` is in milliseconds, so that the BUBBLEs' durations predict the step's.
  bool cost_in_ms = false;
  // On simulated time, what every compute instruction and message takes.
  std::optional<pipeline::CostModel> compute;
};

// 4. The split (logged by the `leader`) and the schedule: `layout.chunks` is set from it.
absl::StatusOr<PipelineSetup> PipelinePhase(const Config& config, const GPT2Config& model,
                                            const std::optional<PartCosts>& part_costs,
                                            const BackendOptions& backend,
                                            pipeline::RankLayout* layout, bool simulated,
                                            bool leader);

// 5. The transport a Trainer owns: the emulated peers (runtime.emulate_peers), a world of one
// where `given` is null, else null (the given one is used).
absl::StatusOr<std::unique_ptr<pipeline::Transport>> TransportPhase(
    const Config& config, const pipeline::Transport* given, const PipelineSetup& pipeline,
    const pipeline::RankLayout& layout, const BackendOptions& backend, Clock* clock);

// The specs of this rank's chunks, in chunk order.
std::vector<StageSpec> OwnChunkSpecs(const PipelineSetup& pipeline,
                                     const pipeline::RankLayout& layout);

// 6. This rank's chunks, each holding `slots` micro-batches: model.init_from's slice of the
// whole model, or initialised from run.seed. `device_messages[c]`: the messages chunk c will
// allocate on its device (BackendOptions::device_messages; empty: none). Under ZeRO-1 (dp > 1)
// each chunk is made with this rank's share (the data-parallel buckets' split), its
// all-gather in place on the device where `zero_on_device` (NCCL), else through host memory.
absl::StatusOr<std::vector<std::unique_ptr<StageModel>>> StageModelsPhase(
    const Config& config, const GPT2Config& model, const BackendOptions& backend,
    const pipeline::RankLayout& layout, const std::vector<StageSpec>& specs, int slots,
    const std::vector<int64_t>& device_messages = {}, bool zero_on_device = false);

struct Executors {
  std::unique_ptr<pipeline::StageExecutor> train;
  std::unique_ptr<pipeline::StageExecutor> eval;  // with data.val only
};

// 7. The training schedule's executor over `chunks` with `hooks`, and with data.val one for
// validation: forward passes only, in the training schedule's geometry.
Executors ExecutorPhase(const Config& config, const PipelineSetup& pipeline,
                        const pipeline::RankLayout& layout, const std::vector<StageModel*>& chunks,
                        pipeline::Transport* transport, pipeline::OptimizerHooks hooks,
                        Clock* clock);

// The validation schedule of a training schedule: each stage runs its chunks in order, every
// micro-batch of one before the next (a stage's chunk c is before its chunk c+1 in the
// pipeline in every placement, so nothing waits in a cycle).
pipeline::Schedule ForwardOnlySchedule(const pipeline::Schedule& training);

}  // namespace freeride
