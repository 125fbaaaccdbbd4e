// `freeride report`: one self-contained HTML page of a run (inline SVG and CSS, no script, no
// network): its state, loss, speed, learning rate and gradient norm over the steps, bubbles
// and the side work in them per stage and kind, predicted against measured bubbles, the side
// tasks, overhead and reclaimed work, the fill jobs, the timeline of a measured step, a study's
// arms and the config. Sections without data in the run are left out.
// report_compare.h puts several runs on one page.
#pragma once

#include <string>

#include "trainer/report/report_data.h"

namespace freeride {

std::string RenderReport(const RunFiles& run);

// The pages' CSS (a report and a comparison look alike).
const char* ReportStyle();

}  // namespace freeride
