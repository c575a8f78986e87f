#include "pipeline/task.h"

namespace pipit {

std::ostream& operator<<(std::ostream& out, const Task& task) {
  return out << (task.phase == Phase::Forward ? 'F' : 'B') << task.microbatch << 'c' << task.chunk;
}

}  // namespace pipit
