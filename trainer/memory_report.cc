#include "trainer/memory_report.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "models/device_memory_plan.h"
#include "pipeline/generators.h"
#include "trainer/trainer.h"

namespace freeride {

absl::StatusOr<std::string> DeviceMemoryReport(const Config& config) {
  absl::StatusOr<GPT2Config> model = ResolveModelConfig(config);
  if (!model.ok()) return model.status();
  absl::StatusOr<pipeline::ScheduleOptions> options = TrainingScheduleOptions(config);
  if (!options.ok()) return options.status();
  absl::StatusOr<pipeline::Schedule> schedule = pipeline::BuildSchedule(*options);
  if (!schedule.ok()) return schedule.status();
  const int pp = options->stages, chunks = options->chunks;
  absl::StatusOr<std::vector<StageSpec>> specs =
      SplitIntoStages(*model, pp * chunks, config.parallel.layers_per_stage);
  if (!specs.ok()) return specs.status();
  const int64_t micro_batch = config.train.batch_size / config.train.microbatches;
  const int bytes = config.runtime.precision == "bf16" ? 2 : 4;
  std::string out = absl::StrFormat(
      "device memory per rank on the CUDA backend: %s, micro-batch %d × %d, %s schedule, "
      "%d stage(s) × %d chunk(s)\n",
      config.runtime.precision, micro_batch, config.train.seq_len, config.parallel.schedule, pp,
      chunks);
  for (int s = 0; s < pp; ++s) {
    const int slots = std::max(1, schedule->buffers_per_stage[s]);
    MemoryPlan plan;
    std::string layers;
    for (int c = 0; c < chunks; ++c) {
      const StageSpec& spec = (*specs)[c * pp + s];
      PlanStageMemory(*model, spec, micro_batch, config.train.seq_len, slots, bytes, &plan);
      layers += absl::StrFormat("%s[%d, %d)%s%s", c > 0 ? " " : "", spec.first_layer,
                                spec.last_layer, spec.has_embedding ? " +embedding" : "",
                                spec.has_head ? " +head" : "");
    }
    out += absl::StrFormat("stage %d: layers %s; %d activation slot(s): %s\n", s, layers, slots,
                           plan.Report());
  }
  return out;
}

}  // namespace freeride
