#include "train/run_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "tensor/error.h"

namespace pipit {
namespace {

constexpr double kWidth = 860, kHeight = 300;
constexpr double kLeft = 70, kRight = 20, kTop = 34, kBottom = 44;
// A trace of more tasks would make a page no browser draws quickly: trace fewer steps.
constexpr size_t kMaxTasks = 20000;

std::string number(double value, const char* pattern = "%.1f") {
  char text[64];
  std::snprintf(text, sizeof text, pattern, value);
  return text;
}

std::string escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string tick(double value) {
  return number(std::abs(value) < 1e-12 ? 0 : value, "%.6g");  // round ticks print short
}

// An axis: from `low` to `high` in steps of `step`, each a round number (1, 2, 2.5 or 5 times
// a power of ten), the data's range widened to the ticks around it.
struct Range {
  double low = 0, high = 1, step = 0.25;
  double at(double value, double from, double to) const {
    return from + (value - low) / (high - low) * (to - from);
  }
};

Range range_of(const std::vector<double>& values) {
  if (values.empty()) return {};
  auto [low, high] = std::ranges::minmax(values);
  if (high - low < 1e-12 * std::max(1.0, std::abs(high))) {
    low -= 0.5 * std::max(1.0, std::abs(low) * 0.1);
    high += 0.5 * std::max(1.0, std::abs(high) * 0.1);
  }
  const double raw = (high - low) / 4, power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * power;
  for (const double multiple : {1.0, 2.0, 2.5, 5.0}) {
    if (multiple * power >= raw * (1 - 1e-9)) {
      step = multiple * power;
      break;
    }
  }
  return {std::floor(low / step + 1e-9) * step, std::ceil(high / step - 1e-9) * step, step};
}

// A trace's task events and its tracks' names.
struct TraceTask {
  int track;
  double start, duration;
  std::string category, name;
};
struct ParsedTrace {
  std::vector<TraceTask> tasks;
  std::map<int, std::string> tracks;
};

ParsedTrace parse_trace(const nlohmann::json& trace) {
  PIPIT_CHECK(trace.is_object() && trace.contains("traceEvents") && trace["traceEvents"].is_array(),
              "report: the trace is not Chrome trace JSON ({\"traceEvents\": [...]})");
  ParsedTrace parsed;
  size_t index = 0;
  for (const nlohmann::json& event : trace["traceEvents"]) {
    const std::string where = "report: trace event " + std::to_string(index++);
    PIPIT_CHECK(event.is_object() && event.value("ph", "") != "", where, " has no \"ph\"");
    PIPIT_CHECK(event.contains("tid") && event["tid"].is_number_integer(), where,
                " has no integer \"tid\"");
    const int track = event["tid"].get<int>();
    if (event["ph"] == "M") {
      parsed.tracks[track] = event.value("/args/name"_json_pointer, std::string("track"));
      continue;
    }
    if (event["ph"] != "X") continue;
    PIPIT_CHECK(event.contains("ts") && event["ts"].is_number() && event.contains("dur") &&
                    event["dur"].is_number() && event["dur"].get<double>() >= 0,
                where, " needs numbers \"ts\" and \"dur\" >= 0");
    PIPIT_CHECK(parsed.tasks.size() < kMaxTasks, "report: the trace has more than ", kMaxTasks,
                " tasks; trace fewer steps");
    parsed.tasks.push_back({track, event["ts"].get<double>(), event["dur"].get<double>(),
                            event.value("cat", std::string()), event.value("name", std::string())});
    parsed.tracks.try_emplace(track, "track " + std::to_string(track));
  }
  PIPIT_CHECK(!parsed.tasks.empty(), "report: the trace holds no task events");
  return parsed;
}

// The legend of the colours of the task categories in `tasks`, from `x` along the line at `y`.
std::string task_legend(const std::vector<TraceTask>& tasks, double x, double y) {
  std::string svg;
  for (const char* category : {"forward", "backward", "input gradient", "weight gradient",
                               "recompute", "gradient sum", "remap"}) {
    if (std::ranges::none_of(tasks, [&](const TraceTask& t) { return t.category == category; })) {
      continue;
    }
    svg += "<rect x=\"" + number(x) + "\" y=\"" + number(y) +
           "\" width=\"12\" height=\"12\" fill=\"" + task_colour(category) + "\"/><text x=\"" +
           number(x + 16) + "\" y=\"" + number(y + 11) + "\">" + category + "</text>\n";
    x += 30 + 7 * static_cast<double>(std::string(category).size());
  }
  return svg;
}

}  // namespace

const char* task_colour(const std::string& category) {
  static const std::map<std::string, const char*> colours = {
      {"forward", "#4e79a7"},        {"backward", "#f28e2b"},
      {"input gradient", "#e15759"}, {"weight gradient", "#59a14f"},
      {"recompute", "#b07aa1"},      {"gradient sum", "#9c755f"},
      {"remap", "#76b7b2"}};
  const auto found = colours.find(category);
  return found == colours.end() ? "#bab0ac" : found->second;
}

std::string line_chart_svg(const std::string& title, const std::string& x_label,
                           const std::vector<ChartSeries>& series) {
  std::vector<double> xs, ys;
  for (const ChartSeries& s : series) {
    for (const auto& [x, y] : s.points) {
      xs.push_back(x);
      ys.push_back(y);
    }
  }
  const Range x_range = range_of(xs), y_range = range_of(ys);
  const double x0 = kLeft, x1 = kWidth - kRight, y0 = kHeight - kBottom, y1 = kTop;
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + number(kWidth) +
                    "\" height=\"" + number(kHeight) + "\" font-family=\"sans-serif\" " +
                    "font-size=\"12\">\n<text x=\"" + number(x0) + "\" y=\"20\" font-size=\"15\">" +
                    escape(title) + "</text>\n";
  svg += "<rect x=\"" + number(x0) + "\" y=\"" + number(y1) + "\" width=\"" + number(x1 - x0) +
         "\" height=\"" + number(y0 - y1) + "\" fill=\"none\" stroke=\"#999\"/>\n";
  for (double x = x_range.low; x <= x_range.high + x_range.step / 2; x += x_range.step) {
    svg += "<text x=\"" + number(x_range.at(x, x0, x1)) + "\" y=\"" + number(y0 + 16) +
           "\" text-anchor=\"middle\">" + tick(x) + "</text>\n";
  }
  for (double y = y_range.low; y <= y_range.high + y_range.step / 2; y += y_range.step) {
    svg += "<text x=\"" + number(x0 - 6) + "\" y=\"" + number(y_range.at(y, y0, y1) + 4) +
           "\" text-anchor=\"end\">" + tick(y) + "</text>\n";
  }
  svg += "<text x=\"" + number((x0 + x1) / 2) + "\" y=\"" + number(kHeight - 6) +
         "\" text-anchor=\"middle\">" + escape(x_label) + "</text>\n";
  double legend_x = x1;
  for (auto s = series.rbegin(); s != series.rend(); ++s) {
    legend_x -= 14 + 7.5 * static_cast<double>(s->name.size()) + 16;
    svg += "<rect x=\"" + number(legend_x) + "\" y=\"12\" width=\"12\" height=\"4\" fill=\"" +
           s->colour + "\"/><text x=\"" + number(legend_x + 16) + "\" y=\"18\">" + escape(s->name) +
           "</text>\n";
  }
  for (const ChartSeries& s : series) {
    std::string points;
    for (const auto& [x, y] : s.points) {
      if (!points.empty()) points += ' ';
      points += number(x_range.at(x, x0, x1));
      points += ',';
      points += number(y_range.at(y, y0, y1));
    }
    svg += "<polyline fill=\"none\" stroke-width=\"2\" stroke=\"" + s.colour + "\" points=\"" +
           points + "\"/>\n";
    if (s.points.size() == 1) {  // a lone point draws no line
      svg += "<circle r=\"3\" fill=\"" + s.colour + "\" cx=\"" +
             points.substr(0, points.find(',')) + "\" cy=\"" + points.substr(points.find(',') + 1) +
             "\"/>\n";
    }
  }
  return svg + "</svg>\n";
}

std::string timeline_svg(const nlohmann::json& trace) {
  const auto [tasks, tracks] = parse_trace(trace);
  double begin = tasks[0].start, end = tasks[0].start + tasks[0].duration;
  for (const TraceTask& t : tasks) {
    begin = std::min(begin, t.start);
    end = std::max(end, t.start + t.duration);
  }
  const Range time{begin, std::max(end, begin + 1e-9)};
  constexpr double kRow = 26, kLabel = 170;
  std::map<int, int> row_of;
  for (const auto& [track, name] : tracks) row_of[track] = static_cast<int>(row_of.size());
  const double height = kTop + kRow * static_cast<double>(tracks.size()) + 40;
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + number(kWidth) +
                    "\" height=\"" + number(height) + "\" font-family=\"sans-serif\" " +
                    "font-size=\"12\">\n";
  std::map<int, double> busy;
  for (const TraceTask& t : tasks) busy[t.track] += t.duration;
  for (const auto& [track, name] : tracks) {
    const double y = kTop + kRow * row_of[track];
    svg += "<rect x=\"" + number(kLabel) + "\" y=\"" + number(y) + "\" width=\"" +
           number(kWidth - kRight - kLabel) + "\" height=\"" + number(kRow - 4) +
           "\" fill=\"#f4f4f4\"/>\n<text x=\"4\" y=\"" + number(y + 16) + "\">" + escape(name) +
           " (" + number(100 * busy[track] / (time.high - time.low), "%.0f") + "% busy)</text>\n";
  }
  for (const TraceTask& t : tasks) {
    const double x = time.at(t.start, kLabel, kWidth - kRight);
    const double w = std::max(0.5, time.at(t.start + t.duration, kLabel, kWidth - kRight) - x);
    svg += "<rect x=\"" + number(x, "%.2f") + "\" y=\"" + number(kTop + kRow * row_of[t.track]) +
           "\" width=\"" + number(w, "%.2f") + "\" height=\"" + number(kRow - 4) + "\" fill=\"" +
           task_colour(t.category) + "\"><title>" + escape(t.name) + " " +
           number(t.duration / 1000, "%.3f") + " ms</title></rect>\n";
  }
  svg += task_legend(tasks, kLabel, kTop + kRow * static_cast<double>(tracks.size()) + 14);
  svg += "<text x=\"4\" y=\"20\" font-size=\"15\">Pipeline timeline, " +
         number((time.high - time.low) / 1000, "%.1f") + " ms (blank: bubbles)</text>\n";
  return svg + "</svg>\n";
}

std::string run_report_html(const std::vector<Progress>& metrics, const nlohmann::json& trace,
                            const std::string& title) {
  ChartSeries train{"training loss", "#4e79a7", {}}, val{"validation loss", "#e15759", {}};
  ChartSeries speed{"tokens/s", "#59a14f", {}};
  for (const Progress& p : metrics) {
    const double step = static_cast<double>(p.step);
    train.points.emplace_back(step, p.train_loss);
    if (p.val_loss) val.points.emplace_back(step, *p.val_loss);
    speed.points.emplace_back(step, p.tokens_per_s);
  }
  std::vector<ChartSeries> losses = {train};
  if (!val.points.empty()) losses.push_back(val);
  std::string html =
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + escape(title) +
      "</title></head>\n<body style=\"font-family: sans-serif; margin: 24px\">\n<h1>" +
      escape(title) + "</h1>\n";
  if (!metrics.empty()) {
    const Progress& last = metrics.back();
    html += "<p>" + std::to_string(last.step) + " steps in " + number(last.elapsed_s) +
            " s; last training loss " + number(last.train_loss, "%.4f");
    for (auto p = metrics.rbegin(); p != metrics.rend(); ++p) {
      if (!p->val_loss) continue;
      html += ", last validation loss " + number(*p->val_loss, "%.4f") + " (step " +
              std::to_string(p->step) + ")";
      break;
    }
    html += ".</p>\n" + line_chart_svg("Loss", "step", losses) +
            line_chart_svg("Throughput", "step", {speed});
  }
  if (!trace.is_null()) html += timeline_svg(trace);
  return html + "</body></html>\n";
}

}  // namespace pipit
