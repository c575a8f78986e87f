// Schedules written by hand (pipeline/schedules/schedule.h, parse_schedule_table).
#include <sstream>

#include "pipeline/schedules/schedule.h"
#include "tensor/error.h"

namespace pipit {
namespace {

// Parses "<phase><microbatch>[c<chunk>]"; the chunk may be left out when each stage holds one.
Task parse_task(const std::string& token, int stage, int line, int chunks_per_stage) {
  auto fail = [&](const std::string& why) {
    throw Error(detail::concat("schedule table, line ", line, " (stage ", stage, "): \"", token,
                               "\" ", why));
  };
  Task task;
  task.stage = stage;
  switch (token.empty() ? '?' : token[0]) {
    case 'F':
      task.phase = Phase::Forward;
      break;
    case 'B':
      task.phase = Phase::Backward;
      break;
    case 'I':
      task.phase = Phase::InputGrad;
      break;
    case 'W':
      task.phase = Phase::WeightGrad;
      break;
    default:
      fail("is not a task: F, B, I or W, a microbatch and c<chunk>, like F3 or I3c5");
  }
  size_t at = 1;
  auto number = [&](const char* what) {
    const size_t start = at;
    int64_t value = 0;
    while (at < token.size() && token[at] >= '0' && token[at] <= '9' && at - start < 9) {
      value = value * 10 + (token[at++] - '0');
    }
    if (at == start) fail(detail::concat("has no ", what, " number"));
    return static_cast<int>(value);
  };
  task.microbatch = number("microbatch");
  if (at < token.size() && token[at] == 'c') {
    ++at;
    task.chunk = number("chunk");
  } else if (chunks_per_stage == 1) {
    task.chunk = stage;
  } else {
    fail(detail::concat("needs its chunk (c<chunk>): each stage holds ", chunks_per_stage));
  }
  if (at != token.size()) fail("has trailing characters");
  return task;
}

}  // namespace

Schedule parse_schedule_table(const std::string& table, int stages, int microbatches,
                              int chunks_per_stage) {
  Schedule schedule;
  std::istringstream lines(table);
  std::string text;
  for (int line = 1; std::getline(lines, text); ++line) {
    const size_t comment = text.find('#');
    if (comment != std::string::npos) text.resize(comment);
    std::istringstream tokens(text);
    std::string token;
    std::vector<Task> tasks;
    const int stage = static_cast<int>(schedule.size());
    while (tokens >> token) {
      PIPIT_CHECK(stage < stages, "schedule table, line ", line, ": more lines of tasks than the ",
                  stages, " stages");
      tasks.push_back(parse_task(token, stage, line, chunks_per_stage));
    }
    if (!tasks.empty()) schedule.push_back(std::move(tasks));
  }
  PIPIT_CHECK(schedule.size() == static_cast<size_t>(stages), "schedule table: ", schedule.size(),
              " lines of tasks for ", stages, " stages (one line per stage, in stage order)");
  validate_schedule(schedule, stages, microbatches, chunks_per_stage);
  return schedule;
}

}  // namespace pipit
