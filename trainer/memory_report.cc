#include "trainer/memory_report.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "models/cuda/stage_policy.h"
#include "models/device_memory_plan.h"
#include "pipeline/generators.h"
#include "trainer/pipeline_plan.h"
#include "trainer/trainer.h"

namespace freeride {

absl::StatusOr<std::string> DeviceMemoryReport(const Config& config) {
  absl::StatusOr<GPT2Config> model = ResolveModelConfig(config);
  if (!model.ok()) return model.status();
  if (absl::Status s = RequireGpt2(*model, "the CUDA backend's memory plan"); !s.ok()) return s;
  absl::StatusOr<PipelinePlan> pipeline_plan = PlanPipeline(config, *model);
  if (!pipeline_plan.ok()) return pipeline_plan.status();
  absl::StatusOr<pipeline::Schedule> schedule =
      TrainingSchedule(config, *pipeline_plan, pipeline::CostModel::Uniform());
  if (!schedule.ok()) return schedule.status();
  const int pp = schedule->stages, chunks = schedule->chunks;
  const std::vector<StageSpec>& specs = pipeline_plan->specs;
  const int64_t micro_batch = config.train.batch_size / config.train.microbatches;
  const int bytes = config.runtime.precision == "bf16" ? 2 : 4;
  absl::StatusOr<cuda::AttentionMode> attention =
      cuda::ParseAttentionMode(config.runtime.attention);
  if (!attention.ok()) return attention.status();
  std::string out = absl::StrFormat(
      "device memory per rank on the CUDA backend: %s, micro-batch %d × %d, %s schedule, "
      "%d stage(s) × %d chunk(s); a rank also keeps %.2f GiB free beyond its plan (lazily "
      "loaded kernels, library state, NCCL)\n",
      config.runtime.precision, micro_batch, config.train.seq_len, config.parallel.schedule, pp,
      chunks, cuda::kDeviceHeadroomBytes / double(int64_t{1} << 30));
  for (int s = 0; s < pp; ++s) {
    const int slots = std::max(1, schedule->buffers_per_stage[s]);
    MemoryPlan plan;
    for (int c = 0; c < chunks; ++c) {
      const StageSpec& spec = specs[pipeline::VirtualStageOf(pipeline_plan->placement, pp, s, c)];
      PlanStageMemory(*model, spec, micro_batch, config.train.seq_len, slots, bytes, &plan, true,
                      *attention);
    }
    out += absl::StrFormat("stage %d: layers %s; %d activation slot(s): %s\n", s,
                           DescribeStageChunks(*pipeline_plan, pp, s), slots, plan.Report());
  }
  return out;
}

}  // namespace freeride
