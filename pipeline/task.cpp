#include "pipeline/task.h"

namespace pipit {

char phase_letter(Phase phase) {
  switch (phase) {
    case Phase::Forward:
      return 'F';
    case Phase::Backward:
      return 'B';
    case Phase::InputGrad:
      return 'I';
    case Phase::WeightGrad:
      return 'W';
    case Phase::Recompute:
      return 'R';
  }
  return '?';
}

std::ostream& operator<<(std::ostream& out, const Task& task) {
  return out << phase_letter(task.phase) << task.microbatch << 'c' << task.chunk;
}

}  // namespace pipit
