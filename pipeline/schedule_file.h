// Schedule files: a schedule written by hand or by another tool, read, completed and proven
// safe so that it trains as is. Three forms are read, told apart by their content:
//   freeride text   "stage0: F0 F1 B0 ..." (ScheduleToText; the header is optional)
//   freeride CSV    "stage,index,op,..." rows (ScheduleToCsv)
//   torch CSV       torch.distributed.pipelining's form: one row per rank, one _Action per
//                   cell ("0F0", "1I3", "2W1", "1B0", "0SEND_F0", "(0F1;3B0)OVERLAP_F_B"), the
//                   number before the op the global stage, empty cells idle.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pipeline/cost_model.h"
#include "pipeline/schedule.h"

namespace freeride::pipeline {

// Reads torch.distributed.pipelining's CSV. Compute cells become F/B/I/W of the rank's chunk
// (global stage k is chunk k / p); communication cells are checked for form and left out (the
// passes place SEND right after and RECV right before the compute, and every receive is posted
// at the step's start anyway); UNSHARD, RESHARD and REDUCE_GRAD have no meaning here and are
// refused. The placement (loop or V) is inferred from which rank runs which stage.
absl::StatusOr<Schedule> ScheduleFromTorchCsv(absl::string_view text);
// The compute-only torch CSV of a schedule (what torch's _load_csv reads by default).
std::string ScheduleToTorchCsv(const Schedule& schedule);

// Reads `path` in any of the three forms and makes it a schedule a rank can execute: adds the
// communication and step-end operations when it has none (`data_parallel`: REDUCE_GRADS too),
// derives peers and activation slots it does not give, validates it, and places BUBBLEs with
// `cost` unless it has its own. Every error names the file, and the line of the stage (text,
// torch CSV) or row (freeride CSV) where it was found.
absl::StatusOr<Schedule> LoadScheduleFile(const std::string& path, const CostModel& cost,
                                          bool data_parallel);

}  // namespace freeride::pipeline
