// pipit-report's page: the charts put each point where its value says, and the timeline draws
// each task of a trace where and as long as it ran.
#include <catch2/catch.hpp>

#include "train/run_report.h"

using namespace pipit;

namespace {

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// The drawing area the chart scales to: x from 70 to 840, y from 256 (bottom) to 34 (top), each
// axis from the round tick below its data to the one above.
std::string expected_point(double x, double y, double x_low, double x_high, double y_low,
                           double y_high) {
  const double px = 70 + (x - x_low) / (x_high - x_low) * 770;
  const double py = 256 + (y - y_low) / (y_high - y_low) * (34 - 256);
  char text[64];
  std::snprintf(text, sizeof text, "%.1f,%.1f", px, py);
  return text;
}

}  // namespace

TEST_CASE("a line chart puts each point where its value says", "[report]") {
  const std::string svg =
      line_chart_svg("Loss", "step",
                     {{"training loss", "#111111", {{0, 3.0}, {5, 2.0}, {10, 1.0}}},
                      {"validation loss", "#222222", {{10, 1.5}}}});
  // x in steps of 2.5 from 0 to 10, y in steps of 0.5 from 1 to 3: no widening needed.
  const std::string points = expected_point(0, 3, 0, 10, 1, 3) + " " +
                             expected_point(5, 2, 0, 10, 1, 3) + " " +
                             expected_point(10, 1, 0, 10, 1, 3);
  CHECK(svg.find("stroke=\"#111111\" points=\"" + points + "\"") != std::string::npos);
  CHECK(points == "70.0,34.0 455.0,145.0 840.0,256.0");
  for (const char* label : {">0<", ">2.5<", ">5<", ">7.5<", ">10<", ">1<", ">1.5<", ">3<"}) {
    CHECK(svg.find(label) != std::string::npos);
  }
  // Data from 0.31 to 3.27 gets axis ticks 0, 1, 2, 3 and 4: the axis spans 0 to 4.
  const std::string widened =
      line_chart_svg("Loss", "step", {{"l", "#333333", {{1, 0.31}, {2, 3.27}}}});
  CHECK(widened.find("points=\"" + expected_point(1, 0.31, 1, 2, 0, 4) + " " +
                     expected_point(2, 3.27, 1, 2, 0, 4) + "\"") != std::string::npos);
  // A lone point is drawn as a dot.
  CHECK(svg.find("<circle r=\"3\" fill=\"#222222\"") != std::string::npos);
  CHECK(count(svg, "<polyline") == 2);
}

TEST_CASE("the timeline draws each task where and as long as it ran", "[report]") {
  const nlohmann::json trace = {
      {"traceEvents",
       {{{"ph", "M"}, {"tid", 0}, {"name", "thread_name"}, {"args", {{"name", "stage 0"}}}},
        {{"ph", "M"}, {"tid", 1}, {"name", "thread_name"}, {"args", {{"name", "stage 1"}}}},
        {{"ph", "X"}, {"tid", 0}, {"ts", 0}, {"dur", 250}, {"cat", "forward"}, {"name", "F0"}},
        {{"ph", "X"}, {"tid", 1}, {"ts", 250}, {"dur", 250}, {"cat", "forward"}, {"name", "F0"}},
        {{"ph", "X"}, {"tid", 1}, {"ts", 500}, {"dur", 500}, {"cat", "backward"}, {"name", "B0"}},
        {{"ph", "X"},
         {"tid", 0},
         {"ts", 750},
         {"dur", 250},
         {"cat", "weight gradient"},
         {"name", "W0"}}}}};
  const std::string svg = timeline_svg(trace);
  // 1000 us over x 170..840: 0.67 px a microsecond.
  CHECK(svg.find("<rect x=\"170.00\" y=\"34.0\" width=\"167.50\" height=\"22.0\" fill=\"" +
                 std::string(task_colour("forward")) + "\"><title>F0 0.250 ms") !=
        std::string::npos);
  CHECK(svg.find("<rect x=\"505.00\" y=\"60.0\" width=\"335.00\" height=\"22.0\" fill=\"" +
                 std::string(task_colour("backward")) + "\"><title>B0 0.500 ms") !=
        std::string::npos);
  CHECK(svg.find("<rect x=\"672.50\" y=\"34.0\" width=\"167.50\" height=\"22.0\" fill=\"" +
                 std::string(task_colour("weight gradient")) + "\"><title>W0") !=
        std::string::npos);
  CHECK(svg.find("stage 0 (50% busy)") != std::string::npos);
  CHECK(svg.find("stage 1 (75% busy)") != std::string::npos);
  CHECK(std::string(task_colour("forward")) != task_colour("backward"));
}

TEST_CASE("the page holds the charts and the timeline; a bad trace is named", "[report]") {
  std::vector<Progress> metrics(3);
  for (int i = 0; i < 3; ++i) {
    metrics[i].step = 10 * (i + 1);
    metrics[i].train_loss = 3.0 - i;
    metrics[i].tokens_per_s = 1000;
    metrics[i].elapsed_s = i + 1;
  }
  metrics[2].val_loss = 1.25;
  const nlohmann::json trace = {
      {"traceEvents", {{{"ph", "X"}, {"tid", 0}, {"ts", 0}, {"dur", 5}, {"cat", "forward"}}}}};
  const std::string html = run_report_html(metrics, trace, "run <1>");
  CHECK(html.find("<title>run &lt;1&gt;</title>") != std::string::npos);
  CHECK(count(html, "<svg") == 3);
  CHECK(html.find("last validation loss 1.2500 (step 30)") != std::string::npos);
  CHECK(html.find("<script") == std::string::npos);
  CHECK(count(run_report_html(metrics, nullptr, "t"), "<svg") == 2);
  const nlohmann::json bad = {{"traceEvents", {{{"ph", "X"}, {"tid", 0}, {"dur", 5}}}}};
  CHECK_THROWS_WITH(timeline_svg(bad), Catch::Contains("trace event 0 needs numbers"));
  CHECK_THROWS_WITH(timeline_svg(nlohmann::json::array()), Catch::Contains("Chrome trace JSON"));
}
