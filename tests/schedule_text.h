#pragma once
// Schedules as text, the way tests compare them: "F0c0 F1c0 B0c0", one line per stage.
#include <sstream>
#include <string>
#include <vector>

#include "pipeline/schedules/task.h"

namespace pipit::testing {

inline std::string order(const std::vector<Task>& tasks) {
  std::ostringstream out;
  for (size_t i = 0; i < tasks.size(); ++i) out << (i ? " " : "") << tasks[i];
  return out.str();
}

// A schedule as parse_schedule_table reads it.
inline std::string table_of(const Schedule& schedule) {
  std::string table;
  for (const auto& tasks : schedule) table.append(order(tasks)).append("\n");
  return table;
}

}  // namespace pipit::testing
