// The NCCL transport's links and groups for a pipeline (nccl_transport.h); built with every
// backend, as the schedule is, so that the trainer computes them alike everywhere.
#include <algorithm>

#include "pipeline/comm/nccl_transport.h"
#include "pipeline/schedule.h"
#include "pipeline/stage_executor.h"

namespace freeride::pipeline {

NcclTransportOptions PipelineNcclOptions(const Schedule& schedule, int dp) {
  NcclTransportOptions options;
  const int pp = schedule.stages, m = schedule.microbatches;
  const int virtual_stages = pp * schedule.chunks;
  const RankLayout layout{pp, dp, schedule.chunks};
  options.tags_per_channel = m;
  for (int d = 0; d < dp; ++d) {
    for (const std::vector<Instr>& instrs : schedule.per_stage) {
      for (const Instr& in : instrs) {
        if (in.op != Op::kSendAct && in.op != Op::kSendGrad) continue;
        const int tag = StageExecutor::MessageTag(in.op == Op::kSendGrad, VirtualStage(schedule, in),
                                                  0, virtual_stages, m);
        const NcclLink link{layout.RankOf(in.stage, d), layout.RankOf(in.peer, d), tag / m};
        if (std::find(options.links.begin(), options.links.end(), link) == options.links.end()) {
          options.links.push_back(link);
        }
      }
    }
  }
  std::vector<int> all;
  for (int r = 0; r < pp * dp; ++r) all.push_back(r);
  options.groups.push_back(all);
  for (int d = 0; d < dp; ++d) {
    options.groups.push_back(RankLayout{pp, dp, schedule.chunks, 0, d}.PipelineGroup());
    if (pp > 1) options.groups.push_back({layout.RankOf(0, d), layout.RankOf(pp - 1, d)});
  }
  for (int s = 0; s < pp; ++s) {
    options.groups.push_back(RankLayout{pp, dp, schedule.chunks, s, 0}.DataParallelGroup());
  }
  return options;
}

}  // namespace freeride::pipeline
