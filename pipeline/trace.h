#pragma once
// Trace: when each stage ran each task. Exported as Chrome trace JSON (open it in Perfetto or
// chrome://tracing; one track per stage) or printed as a text timeline.
#include <cstdint>
#include <string>
#include <vector>

#include "pipeline/schedules/task.h"

namespace pipit {

struct TraceEvent {
  Task task;
  double start_us = 0;  // microseconds on the process's steady clock
  double end_us = 0;
};

// A remap (Coordinator::remap): no stage runs a task while it lasts.
struct RemapEvent {
  int64_t step = 0;
  double start_us = 0;
  double end_us = 0;
  std::string ranges;  // the partition it made, ranges_str form
  std::string why;     // "requested", or the rebalancing decision's reason
};

class Trace {
 public:
  void add(const TraceEvent& event) { events_.push_back(event); }
  void add_remap(const RemapEvent& remap) { remaps_.push_back(remap); }
  void clear() {
    events_.clear();
    remaps_.clear();
  }
  const std::vector<TraceEvent>& events() const { return events_; }
  const std::vector<RemapEvent>& remaps() const { return remaps_; }

  // {"traceEvents": [...]}: one complete ("X") event per task, tid = stage, named tracks;
  // remaps on a track of their own after the stages'.
  std::string chrome_json() const;
  void write_chrome_json(const std::string& path) const;
  // One row per stage, one column per `column_us` of time: each cell names the task then
  // running ("F3" forward of microbatch 3, "B3" backward, "I3" and "W3" its input- and
  // weight-gradient parts, "R3" its forward recomputed; ".2" suffix: chunk 2 when v > 1),
  // then a line per remap.
  std::string timeline(double column_us = 0) const;

 private:
  std::vector<TraceEvent> events_;
  std::vector<RemapEvent> remaps_;
};

// Microseconds since an arbitrary fixed point of the steady clock.
double trace_clock_us();

}  // namespace pipit
