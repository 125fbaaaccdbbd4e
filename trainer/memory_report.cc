#include "trainer/memory_report.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "core/host_memory.h"
#include "core/status.h"
#include "models/backend.h"
#include "models/cuda/stage_policy.h"
#include "models/device_memory_plan.h"
#include "pipeline/generators.h"
#include "trainer/pipeline_plan.h"
#include "trainer/trainer.h"

namespace freeride {

absl::StatusOr<std::string> ModelSummary(const Config& config) {
  FR_ASSIGN_OR_RETURN(const GPT2Config model, ResolveModelConfig(config));
  const int64_t T = config.train.seq_len, C = model.n_embd, L = model.n_layer;
  const double flops = TrainingFlopsPerToken(model, T);
  const double matmul = (flops - 12.0 * static_cast<double>(L * C * T)) / 6;
  const std::string shape =
      model.is_llama() ? absl::StrFormat(
                             "%d heads, %d key/value heads), SwiGLU %d, vocabulary %d (padded %d), "
                             "%s head",
                             model.n_head, model.n_kv_head, model.ffn_hidden, model.vocab_size,
                             model.padded_vocab_size, model.tie_embeddings ? "tied" : "untied")
                       : absl::StrFormat("%d heads), vocabulary %d (padded %d), tied head",
                                         model.n_head, model.vocab_size, model.padded_vocab_size);
  const BackendOptions backend{config.runtime.device, config.runtime.precision};
  const int64_t micro_batch = config.train.batch_size / config.train.microbatches;
  const int64_t message_bytes = micro_batch * T * C * MessageTypeBytes(MessageTypeOf(backend));
  const int64_t params = NumParameters(model);
  return absl::StrFormat(
      "model: %s, %d layers × n_embd %d (%s: %d parameters (%.4g B); training %.4g GFLOP per "
      "token at T = %d (6 × %.0f matrix-product parameters + 12·L·C·T attention); a "
      "micro-batch of %d × %d crosses each stage boundary as %s of %s activations\n",
      ModelArchName(model.arch), L, C, shape, params, static_cast<double>(params) / 1e9,
      flops / 1e9, T, matmul, micro_batch, T, FormatBytes(message_bytes),
      MessageTypeName(MessageTypeOf(backend)));
}

absl::StatusOr<std::string> DeviceMemoryReport(const Config& config) {
  absl::StatusOr<GPT2Config> model = ResolveModelConfig(config);
  if (!model.ok()) return model.status();
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

absl::StatusOr<std::string> HostMemoryReport(const Config& config) {
  absl::StatusOr<GPT2Config> model = ResolveModelConfig(config);
  if (!model.ok()) return model.status();
  absl::StatusOr<PipelinePlan> pipeline_plan = PlanPipeline(config, *model);
  if (!pipeline_plan.ok()) return pipeline_plan.status();
  absl::StatusOr<pipeline::Schedule> schedule =
      TrainingSchedule(config, *pipeline_plan, pipeline::CostModel::Uniform());
  if (!schedule.ok()) return schedule.status();
  const int pp = schedule->stages, chunks = schedule->chunks;
  const int64_t micro_batch = config.train.batch_size / config.train.microbatches;
  const int64_t T = config.train.seq_len;
  std::string out = absl::StrFormat(
      "host memory per rank on the CPU backend: fp32, micro-batch %d × %d, %s schedule (AdamW "
      "moments included; message buffers and the batch not)\n",
      micro_batch, T, config.parallel.schedule);
  for (int s = 0; s < pp; ++s) {
    const int slots = std::max(1, schedule->buffers_per_stage[s]);
    const Recompute mode = StageRecompute(config, s);
    int64_t per_slot = 0, recomputed = 0, total = 0;
    for (int c = 0; c < chunks; ++c) {
      const StageSpec& spec =
          pipeline_plan->specs[pipeline::VirtualStageOf(pipeline_plan->placement, pp, s, c)];
      // A slot's bytes: the plan with one slot less.
      const int64_t all = TotalBytes(PlanCpuStageMemory(*model, spec, micro_batch, T, slots, mode));
      per_slot +=
          all - TotalBytes(PlanCpuStageMemory(*model, spec, micro_batch, T, slots - 1, mode));
      for (const HostBuffer& b : PlanCpuStageMemory(*model, spec, micro_batch, T, slots, mode)) {
        if (absl::StartsWith(b.name, "recomputed activations")) recomputed += b.bytes;
      }
      total += all;
    }
    out += absl::StrFormat(
        "stage %d: layers %s; recompute %s; %d activation slot(s) of %s each, %s recomputed "
        "(shared by the slots); %s\n",
        s, DescribeStageChunks(*pipeline_plan, pp, s), RecomputeName(mode), slots,
        FormatBytes(per_slot), FormatBytes(recomputed), FormatBytes(total));
  }
  return out;
}

}  // namespace freeride
