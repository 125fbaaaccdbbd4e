// Pictures and summaries of a simulated schedule: the JSON summary of `freeride simulate`,
// a Chrome trace (opens in Perfetto: one track per stage) and an SVG Gantt chart.
#pragma once

#include <string>

#include "pipeline/schedule.h"
#include "pipeline/simulator.h"

namespace freeride::pipeline {

// {"kind","stages","microbatches","chunks","step_time","bubble_fraction","schedule_bubble",
//  "placement","step_sync",
//  "per_stage":[{"stage","busy","bubble","bubbles":[{"kind","start","duration"}]}]}; times in ms.
std::string SummaryJson(const Schedule& schedule, const SimResult& sim);
// A readable table of the same.
std::string SummaryText(const Schedule& schedule, const SimResult& sim);
// Chrome trace event format; `sim` must come from this schedule. Times in microseconds.
std::string ChromeTrace(const Schedule& schedule, const SimResult& sim);
// Stages × time, compute coloured by op, bubbles shaded by kind, with a legend. `side_steps`
// (per stage, [start, end] in the same time unit) draws side-task steps as bars along the
// bottom of each stage's row; `title` replaces the default heading; `row_notes` (per stage,
// may be empty) is written across that stage's row, e.g. why it holds no measurement.
std::string GanttSvg(
    const Schedule& schedule, const SimResult& sim,
    const std::vector<std::vector<std::pair<double, double>>>* side_steps = nullptr,
    const std::string& title = "", const std::vector<std::string>* row_notes = nullptr);

}  // namespace freeride::pipeline
