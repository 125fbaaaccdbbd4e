// Whether a stage can host a fill job, and if not, why, with the numbers: the job's memory
// limit against the memory left there for side work (runtime.memory_fraction of the device's
// memory less training's planned peak and the limits of the side work it hosts already,
// bounded by the memory free now: trainer/rank_memory.h), and its
// step, as calibrated, against the longest bubble the stage predicts, less freeride.margin
// (what the executor offers side work of a bubble). A job that runs until each bubble's end
// (`command`) has no step to fit: any bubble of at least kMinSideSliceS does.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace freeride {

// What the rank of replica 0 of one stage found when a job was offered.
struct StageRoom {
  int stage = 0;
  bool took_part = false;       // the stage has a rank that answered (not an emulated one)
  bool allowed = false;         // the job's `stages` include it
  int64_t free_bytes = 0;       // memory for side work: the plan's room, bounded by free memory
  double longest_bubble_s = 0;  // the longest bubble it predicts
  bool calibrated = false;      // the job was created there and its steps timed
  double step_s = 0;            // its step alone, as calibrated
  bool fills_bubble = false;    // it runs until each bubble's end instead
  // The plan's figures behind free_bytes (0 where the device's memory is unknown): the
  // rank's share of the device's memory, runtime.memory_fraction, training's planned peak, and
  // the memory limits of the side tasks and jobs it hosts already.
  int64_t device_bytes = 0;
  double fraction = 0;
  int64_t planned_peak_bytes = 0;
  int64_t held_bytes = 0;
};

// The plan's room for side work: fraction × device − planned peak − held, at least 0.
int64_t PlannedSideBytes(const StageRoom& room);
// Empty when a job of `memory_bytes` fits the memory of `room`; else why not, with the plan's
// figures.
std::string MemoryMisfit(int64_t memory_bytes, const StageRoom& room);
// Empty when the calibrated job's step fits a bubble of `room` (margin: freeride.margin).
std::string StepMisfit(const StageRoom& room, double margin);
// Empty when the job fits `room` on both counts.
std::string Misfit(int64_t memory_bytes, const StageRoom& room, double margin);

// Why no stage can host the job: each allowed stage's misfit, joined ("; ").
std::string RefusalReason(int64_t memory_bytes, const std::vector<StageRoom>& rooms, double margin);

}  // namespace freeride
