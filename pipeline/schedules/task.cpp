#include "pipeline/schedules/task.h"

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
    case Phase::GradientSum:
      return 'S';
  }
  return '?';
}

std::ostream& operator<<(std::ostream& out, const Task& task) {
  return out << phase_letter(task.phase) << task.microbatch << 'c' << task.chunk;
}

Placement placement_of(const std::string& schedule) {
  return schedule == "zbv" ? Placement::v : Placement::loop;
}

int stage_of_chunk(int chunk, int stages, Placement placement) {
  if (placement == Placement::loop || chunk < stages) return chunk % stages;
  return 2 * stages - 1 - chunk;
}

int global_chunk(int stage, int local, int stages, Placement placement) {
  if (placement == Placement::loop || local == 0) return local * stages + stage;
  return 2 * stages - 1 - stage;
}

int local_chunk(int chunk, int stages, Placement placement) {
  if (placement == Placement::loop) return chunk / stages;
  return chunk < stages ? 0 : 1;
}

}  // namespace pipit
