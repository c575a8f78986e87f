#pragma once
// A run drawn as one self-contained HTML page (pipit-report): inline SVG, no script, nothing
// fetched. The training and validation loss over steps, tokens/s, and, from a Chrome trace
// (train_gpt --trace), the pipeline's timeline: one row per stage, its forward, backward and
// weight-gradient tasks coloured, the bubbles left blank.
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "train/metrics_log.h"

namespace pipit {

// The page. `trace` is null for none; errors name what in it is malformed.
std::string run_report_html(const std::vector<Progress>& metrics, const nlohmann::json& trace,
                            const std::string& title);

// The pieces, for tests.
struct ChartSeries {
  std::string name, colour;
  std::vector<std::pair<double, double>> points;  // (x, y)
};
// A line chart of `series` on shared axes scaled to their ranges.
std::string line_chart_svg(const std::string& title, const std::string& x_label,
                           const std::vector<ChartSeries>& series);
// The trace's task events ("ph": "X") as rectangles, one row per track, x proportional to time.
std::string timeline_svg(const nlohmann::json& trace);
// The fill colour of a task category ("forward", "backward", ...; grey for others).
const char* task_colour(const std::string& category);

}  // namespace pipit
