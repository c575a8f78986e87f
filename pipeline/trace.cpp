#include "pipeline/trace.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "codec/atomic_file.h"
#include "tensor/error.h"

namespace pipit {

double trace_clock_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

namespace {

std::string cell_label(const Task& task, bool show_chunk) {
  std::ostringstream label;
  label << phase_letter(task.phase) << task.microbatch;
  if (show_chunk) label << '.' << task.chunk;
  return label.str();
}

const char* phase_category(Phase phase) {
  switch (phase) {
    case Phase::Forward:
      return "forward";
    case Phase::Backward:
      return "backward";
    case Phase::InputGrad:
      return "input gradient";
    case Phase::WeightGrad:
      return "weight gradient";
    case Phase::Recompute:
      return "recompute";
    case Phase::GradientSum:
      return "gradient sum";
  }
  return "?";
}

// Chrome's metadata event that names track `tid`.
nlohmann::json track_name(int tid, const std::string& name) {
  return {
      {"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", tid}, {"args", {{"name", name}}}};
}

}  // namespace

std::string Trace::chrome_json() const {
  nlohmann::json events = nlohmann::json::array();
  int stages = 0;
  double origin = events_.empty() ? 0 : events_.front().start_us;
  for (const TraceEvent& e : events_) {
    stages = std::max(stages, e.task.stage + 1);
    origin = std::min(origin, e.start_us);
  }
  for (int s = 0; s < stages; ++s) events.push_back(track_name(s, "stage " + std::to_string(s)));
  // Each stage's gradient sums (replicas) on a track of their own, after the remaps' track.
  std::set<int> summing;
  for (const TraceEvent& e : events_) {
    if (e.task.phase == Phase::GradientSum) summing.insert(e.task.stage);
  }
  for (int s : summing) {
    events.push_back(track_name(stages + 1 + s, "stage " + std::to_string(s) + ": gradient sum"));
  }
  for (const TraceEvent& e : events_) {
    std::ostringstream name;
    name << e.task;
    const bool sum = e.task.phase == Phase::GradientSum;
    events.push_back(
        {{"name", sum ? std::string("gradient sum") : name.str()},
         {"cat", phase_category(e.task.phase)},
         {"ph", "X"},
         {"pid", 0},
         {"tid", sum ? stages + 1 + e.task.stage : e.task.stage},
         {"ts", e.start_us - origin},
         {"dur", e.end_us - e.start_us},
         {"args",
          {{"step", e.task.step}, {"microbatch", e.task.microbatch}, {"chunk", e.task.chunk}}}});
  }
  if (!remaps_.empty()) events.push_back(track_name(stages, "remaps"));
  for (const RemapEvent& r : remaps_) {
    events.push_back({{"name", "remap"},
                      {"cat", "remap"},
                      {"ph", "X"},
                      {"pid", 0},
                      {"tid", stages},
                      {"ts", r.start_us - origin},
                      {"dur", r.end_us - r.start_us},
                      {"args", {{"step", r.step}, {"ranges", r.ranges}, {"why", r.why}}}});
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

void Trace::write_chrome_json(const std::string& path) const {
  write_file_atomic(path, chrome_json());
}

std::string Trace::timeline(double column_us) const {
  if (events_.empty()) return "(empty trace)\n";
  int stages = 0, max_chunk = 0;
  double begin = events_.front().start_us, end = events_.front().end_us;
  double shortest = end - begin;
  for (const TraceEvent& e : events_) {
    stages = std::max(stages, e.task.stage + 1);
    max_chunk = std::max(max_chunk, e.task.chunk);
    begin = std::min(begin, e.start_us);
    end = std::max(end, e.end_us);
    shortest = std::min(shortest, e.end_us - e.start_us);
  }
  // By default the shortest task spans about one column, so every task shows, but a row stays
  // within a few hundred columns: a near-empty task (an I with no input gradient to compute)
  // would otherwise stretch it to tens of thousands. Every task still gets a cell.
  constexpr double kMaxColumns = 300;
  if (column_us <= 0) column_us = std::max({1.0, shortest, (end - begin) / kMaxColumns});
  const bool show_chunk = max_chunk >= stages;

  // A stage runs one task at a time, so its tasks fill its row left to right; each gets at
  // least one cell even where rounding would merge it into its neighbour.
  std::vector<std::vector<std::string>> rows(static_cast<size_t>(stages));
  size_t columns = 0, width = 3;
  for (const TraceEvent& e : events_) {
    auto& row = rows[static_cast<size_t>(e.task.stage)];
    const auto first =
        std::max(row.size(), static_cast<size_t>((e.start_us - begin) / column_us + 0.5));
    const auto last =
        std::max(first + 1, static_cast<size_t>((e.end_us - begin) / column_us + 0.5));
    const std::string label = cell_label(e.task, show_chunk);
    row.resize(first, ".");
    row.resize(last, label);
    columns = std::max(columns, last);
    width = std::max(width, label.size() + 1);
  }

  std::ostringstream out;
  out << "timeline: " << columns << " columns of " << column_us / 1000.0 << " ms\n";
  for (int s = 0; s < stages; ++s) {
    auto& row = rows[static_cast<size_t>(s)];
    row.resize(columns, ".");
    out << "stage " << s << " |";
    for (const std::string& cell : row) out << std::string(width - cell.size(), ' ') << cell;
    out << "\n";
  }
  for (const RemapEvent& r : remaps_) {
    out << "remap at column " << static_cast<int64_t>((r.start_us - begin) / column_us) << " ("
        << (r.end_us - r.start_us) / 1000.0 << " ms): " << r.ranges << " (" << r.why << ")\n";
  }
  return out.str();
}

}  // namespace pipit
