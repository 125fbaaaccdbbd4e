// What one rank of a stage holds at its peak, term by term, and what that leaves to side work
// under runtime.memory_fraction: the one plan that `freeride config memory` prints, the trainer
// checks and logs at start, and fill-job placement and the side-task memory check use.
//
// On the CPU the peak is the process's baseline (its code, libraries and MPI's state, measured
// as the resident set before the model is built) plus what the run allocates: the model
// chunks (parameters, gradients, activation slots, recomputation scratch: PlanCpuStageMemory),
// the AdamW moments (a ZeRO-1 share), the message buffers the schedule's sends and receives
// use, the global batch, the data-parallel buckets' copy, post-validation's copies, and MPI's
// temporaries: Open MPI keeps a temporary the size of the data of an in-place non-blocking
// sum, so the gradients' data-parallel sum costs their size again (measured: bench/RESULTS.md).
// On CUDA the peak is the chunk's device plan (models/device_memory_plan.h) plus the room a
// rank keeps beyond it (cuda::kDeviceHeadroomBytes: kernels, library state, NCCL).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/host_memory.h"
#include "models/gpt2_config.h"
#include "pipeline/schedule.h"
#include "trainer/config/config.h"
#include "trainer/config/side_task_check.h"
#include "trainer/pipeline_plan.h"

namespace freeride {

// What the plan takes from the machine (or from the config) rather than from the model.
struct MemoryFacts {
  int64_t baseline_bytes = 0;  // the process before its model (CPU)
  std::string baseline_source;
  int64_t device_bytes = 0;  // the device's memory (the whole host's on the CPU); 0: unknown
  std::string device_source;
  int sharing = 1;   // ranks sharing that device (the host's node-local ranks on the CPU)
  bool mpi = false;  // the data-parallel sums run on MPI (its temporaries are counted)
  // The transport carries device memory (NCCL): ZeRO-1's all-gather runs in place on the
  // device, with no host copy of the parameters.
  bool device_transport = false;
};

struct RankMemoryPlan {
  int stage = 0;
  bool cuda = false;                // the plan is of the GPU's memory; else the host's
  std::vector<HostBuffer> buffers;  // what the run allocates there, by name (not the baseline)
  // What the rank allocates in host memory (on the CPU the same as `buffers`; on CUDA the
  // message buffers, batch and copies beside the chunk), for the check before allocating.
  std::vector<HostBuffer> host_buffers;
  int64_t baseline_bytes = 0;
  int64_t peak_bytes = 0;    // baseline + the buffers
  int64_t device_bytes = 0;  // this rank's share of the device's memory; 0: unknown
  double fraction = 0;       // runtime.memory_fraction
  int64_t side_bytes = 0;    // fraction × device_bytes − peak, at least 0 (0 when unknown)
};

// This process's resident set at its first call (the trainer makes it before building its
// model, so every trainer of a process plans with the same baseline).
int64_t ProcessBaselineBytes();

// What Open MPI's initialisation adds to a process's resident set (its libraries and
// buffers): 16.0 → 25.7 MiB across MPI_Init_thread on Open MPI 4.1, Debian 12 (2026-11-27).
// `config memory` does not start MPI, so it adds this to its own resident set for a run of
// several ranks; a rank measures its own.
inline constexpr int64_t kMpiInitBytes = int64_t{10} << 20;

// The device's memory for the plan: runtime.device_memory_mb when set, else the host's
// (TotalHostMemory) on the CPU, the rank's GPU's total on CUDA (0, "unknown", without one).
void FindDeviceMemory(const Config& config, MemoryFacts* facts);

// The facts `config memory` and `config check` plan with: this process's baseline (plus
// kMpiInitBytes for a run of several ranks), the device's memory shared by every rank of the
// run (the CPU pipeline's ranks on one machine), MPI's sums at dp > 1, and the transport
// parallel.transport picks for the run's ranks in a CUDA build with NCCL (ChooseTransport).
MemoryFacts PlanningFacts(const Config& config);

// The plan of stage `stage`'s rank in replica `replica` (its ZeRO-1 share), for `schedule`.
absl::StatusOr<RankMemoryPlan> PlanRankMemory(const Config& config, const GPT2Config& model,
                                              const PipelinePlan& pipeline_plan,
                                              const pipeline::Schedule& schedule, int stage,
                                              int replica, const MemoryFacts& facts);

// Every stage's plan (the schedule's bubbles placed by uniform costs), each of the replica
// holding the largest ZeRO-1 share of it.
absl::StatusOr<std::vector<RankMemoryPlan>> PlanStagesMemory(const Config& config,
                                                             const MemoryFacts& facts);

// On CUDA, where the device's memory is known (runtime.device_memory_mb, or the GPU's total):
// ResourceExhausted when training's planned peak does not fit in it, naming both figures,
// each phase of the plan and `device_source`, before any chunk is made. OK otherwise.
absl::Status CheckDevicePlan(const RankMemoryPlan& plan, const std::string& device_source);

// "0.90 × 5.88 GiB − training's planned peak 264.4 MiB" (or why there is no figure).
std::string DescribeSideRoom(const RankMemoryPlan& plan);

// Each stage's room for the side-task memory check (CheckSideTaskPlacement); empty (the check
// falls back to free memory) where a stage's device memory is unknown.
std::vector<SideRoom> SideRooms(const std::vector<RankMemoryPlan>& plans);
// SideRooms of PlanStagesMemory(config, PlanningFacts(config)), for `config check` and
// `submit`; empty where the config cannot be planned (its own errors say why elsewhere).
std::vector<SideRoom> PlannedSideRooms(const Config& config);

}  // namespace freeride
