#pragma once
// Trace: when each stage ran each task. Exported as Chrome trace JSON (open it in Perfetto or
// chrome://tracing; one track per stage) or printed as a text timeline.
#include <string>
#include <vector>

#include "pipeline/task.h"

namespace pipit {

struct TraceEvent {
  Task task;
  double start_us = 0;  // microseconds on the process's steady clock
  double end_us = 0;
};

class Trace {
 public:
  void add(const TraceEvent& event) { events_.push_back(event); }
  void clear() { events_.clear(); }
  const std::vector<TraceEvent>& events() const { return events_; }

  // {"traceEvents": [...]}: one complete ("X") event per task, tid = stage, named tracks.
  std::string chrome_json() const;
  void write_chrome_json(const std::string& path) const;
  // One row per stage, one column per `column_us` of time: each cell names the task then
  // running ("F3" forward of microbatch 3, "b3" backward; ".2" suffix: chunk 2 when v > 1).
  std::string timeline(double column_us = 0) const;

 private:
  std::vector<TraceEvent> events_;
};

// Microseconds since an arbitrary fixed point of the steady clock.
double trace_clock_us();

}  // namespace pipit
