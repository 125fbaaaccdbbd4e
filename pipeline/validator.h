// Proves a schedule safe before it runs. Rules, each named in the error:
//   shape            stage lines, stage/chunk/micro-batch numbers in range
//   once             each micro-batch's F once per stage and chunk, and B once or I and W once
//   order            backward (B or I) after its F, W after its I
//   buffers          activation slots in range and never holding two live micro-batches
//   recv before use  a compute that needs a peer's output is preceded by its RECV
//   send after make  a SEND follows the compute that produces it
//   matched          every RECV has the peer's SEND and vice versa, peer fields agree
//   channel order    the SENDs from one stage to another on a channel (activations or
//                    gradients) come in the order the peer RECVs them (NCCL pairs them so)
//   tied             REDUCE_TIED after what makes each share of the tied gradient (a
//                    post-validated head makes its share in I, in its W order)
//   progress         a unit-time simulation finishes (no deadlock)
// A violation is reported with its stage, position and rule, and the grid around it.
#pragma once

#include "absl/status/status.h"
#include "pipeline/schedule.h"

namespace freeride::pipeline {

// Where a violation was found (stage, position in its list; -1 when not one instruction's).
struct ValidationSite {
  int stage = -1;
  int position = -1;
};

absl::Status Validate(const Schedule& schedule, ValidationSite* site = nullptr);

}  // namespace freeride::pipeline
