#include "trainer/transport_choice.h"

#include "absl/strings/str_format.h"
#include "core/device.h"
#include "core/status.h"
#include "pipeline/cost_model.h"
#include "trainer/pipeline_plan.h"
#include "trainer/trainer.h"

namespace freeride {

absl::StatusOr<TransportChoice> ChooseTransport(const Config& config, int world,
                                                bool nccl_across_processes) {
  const std::string& asked = config.parallel.transport;
  const bool cuda = config.runtime.device == "cuda";
  if (asked == "mpi") return TransportChoice{false, "parallel.transport = \"mpi\""};
  if (asked == "nccl") {
    if (!cuda) {
      return absl::InvalidArgumentError(
          "parallel.transport = \"nccl\" needs runtime.device = \"cuda\" (NCCL moves device "
          "memory); use \"mpi\" or \"auto\"");
    }
    if (!nccl_across_processes) {
      return absl::FailedPreconditionError(
          "parallel.transport = \"nccl\", but this build has no NCCL that joins processes (a "
          "CUDA build has it; the emulation build's joins threads of one process, for its "
          "tests); use \"mpi\" or \"auto\"");
    }
    return TransportChoice{true, "parallel.transport = \"nccl\""};
  }
  if (!cuda) {
    return TransportChoice{false, "parallel.transport = \"auto\": the stages run on the cpu"};
  }
  if (world <= 1) {
    return TransportChoice{false, "parallel.transport = \"auto\": one rank, nothing to carry"};
  }
  if (!nccl_across_processes) {
    return TransportChoice{false,
                           "parallel.transport = \"auto\": this build has no NCCL that joins "
                           "processes"};
  }
  return TransportChoice{
      true, absl::StrFormat("parallel.transport = \"auto\": %d ranks, every stage on CUDA", world)};
}

std::string DescribeTransport(const TransportChoice& choice, int gpu) {
  if (choice.nccl) {
    return absl::StrFormat(
        "transport: NCCL carries activations, gradients and every sum between the GPUs "
        "(this rank: cuda:%d); MPI only started it (%s)",
        gpu, choice.why);
  }
  return absl::StrFormat(
      "transport: MPI carries activations, gradients and sums through host memory (%s)",
      choice.why);
}

absl::StatusOr<pipeline::NcclTransportOptions> NcclOptionsOf(const Config& config) {
  FR_ASSIGN_OR_RETURN(GPT2Config model, ResolveModelConfig(config));
  FR_ASSIGN_OR_RETURN(PipelinePlan plan, PlanPipeline(config, model));
  // The bubbles' placement (the cost model) moves no message: uniform costs give the links.
  FR_ASSIGN_OR_RETURN(pipeline::Schedule schedule,
                      TrainingSchedule(config, plan, pipeline::CostModel::Uniform()));
  pipeline::NcclTransportOptions options =
      pipeline::PipelineNcclOptions(schedule, static_cast<int>(config.parallel.dp));
  options.timeout_s = config.runtime.comm_timeout_s;
  return options;
}

int GpuOf(const Config& config) {
  return config.runtime.gpu >= 0 ? static_cast<int>(config.runtime.gpu) : NodeLocalRank();
}

}  // namespace freeride
