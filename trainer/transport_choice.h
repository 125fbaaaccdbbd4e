// Which transport carries a training's messages and sums (parallel.transport), and which CUDA
// device each rank takes (runtime.gpu): decided here, logged at the start, made in cmd_train.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "pipeline/comm/nccl_transport.h"
#include "trainer/config/config.h"

namespace freeride {

struct TransportChoice {
  bool nccl = false;
  std::string why;  // for the start log: what made the choice
};

// `world`: the job's ranks; `nccl_across_processes`: whether this build's NCCL can join ranks
// that are processes (not the emulation build's, which joins threads of one process).
// "nccl" where it cannot be had is an error naming the key; "auto" falls back to MPI.
absl::StatusOr<TransportChoice> ChooseTransport(const Config& config, int world,
                                                bool nccl_across_processes);

// The start log's line: which transport carries what.
std::string DescribeTransport(const TransportChoice& choice, int gpu);

// The NCCL transport's links and groups for the training `config` describes: those of the
// schedule every rank runs (pipeline::PipelineNcclOptions), with runtime.comm_timeout_s.
absl::StatusOr<pipeline::NcclTransportOptions> NcclOptionsOf(const Config& config);

// The CUDA device index a rank asks for: runtime.gpu, or its node-local rank when that is -1
// (taken modulo the visible devices where the chunk is made).
int GpuOf(const Config& config);

}  // namespace freeride
