#include "trainer/jobs/job_placement.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/host_memory.h"
#include "freeride/executor.h"

namespace freeride {

int64_t PlannedSideBytes(const StageRoom& room) {
  const double room_bytes = room.fraction * static_cast<double>(room.device_bytes);
  return std::max<int64_t>(
      0, static_cast<int64_t>(room_bytes) - room.planned_peak_bytes - room.held_bytes);
}

std::string MemoryMisfit(int64_t memory_bytes, const StageRoom& room) {
  if (memory_bytes <= room.free_bytes) return "";
  if (room.device_bytes <= 0) {
    return absl::StrFormat("needs %s; stage %d has %s free", FormatBytes(memory_bytes), room.stage,
                           FormatBytes(room.free_bytes));
  }
  const int64_t planned = PlannedSideBytes(room);
  const std::string plan = absl::StrFormat(
      "runtime.memory_fraction %.2f × %s − training's planned peak %s%s", room.fraction,
      FormatBytes(room.device_bytes), FormatBytes(room.planned_peak_bytes),
      room.held_bytes > 0
          ? absl::StrFormat(" − %s its side work holds", FormatBytes(room.held_bytes))
          : "");
  if (room.free_bytes < planned) {
    return absl::StrFormat(
        "needs %s; stage %d has %s free now (its plan leaves %s for side work: %s)",
        FormatBytes(memory_bytes), room.stage, FormatBytes(room.free_bytes), FormatBytes(planned),
        plan);
  }
  return absl::StrFormat("needs %s; stage %d has %s for side work (%s)", FormatBytes(memory_bytes),
                         room.stage, FormatBytes(room.free_bytes), plan);
}

std::string StepMisfit(const StageRoom& room, double margin) {
  const double offered = room.longest_bubble_s * (1 - margin);
  if (room.longest_bubble_s <= 0) {
    return absl::StrFormat("stage %d has no bubble to run in", room.stage);
  }
  if (room.fills_bubble) {
    if (offered >= kMinSideSliceS) return "";
    return absl::StrFormat(
        "runs until a bubble's end, but the longest bubble on stage %d is %.2f ms (%.2f ms "
        "offered to side work, under the %.2f ms a switch is worth)",
        room.stage, room.longest_bubble_s * 1e3, offered * 1e3, kMinSideSliceS * 1e3);
  }
  if (room.step_s <= offered) return "";
  return absl::StrFormat(
      "needs %.2f ms steps; the longest bubble on stage %d is %.2f ms (%.2f ms of it offered to "
      "side work, freeride.margin = %g)",
      room.step_s * 1e3, room.stage, room.longest_bubble_s * 1e3, offered * 1e3, margin);
}

std::string Misfit(int64_t memory_bytes, const StageRoom& room, double margin) {
  if (std::string memory = MemoryMisfit(memory_bytes, room); !memory.empty()) return memory;
  return StepMisfit(room, margin);
}

std::string RefusalReason(int64_t memory_bytes, const std::vector<StageRoom>& rooms,
                          double margin) {
  std::vector<std::string> reasons;
  for (const StageRoom& room : rooms) {
    if (!room.allowed) continue;
    if (!room.took_part) {
      reasons.push_back(absl::StrFormat("stage %d has no rank here (emulated)", room.stage));
      continue;
    }
    if (std::string why = Misfit(memory_bytes, room, margin); !why.empty()) {
      reasons.push_back(why);
    }
  }
  if (reasons.empty()) return "no stage it may run on";
  return absl::StrJoin(reasons, "; ");
}

}  // namespace freeride
