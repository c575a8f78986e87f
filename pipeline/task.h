#pragma once
// Task: one unit of pipeline work, the forward or backward pass of one microbatch through one
// model chunk. Zero-bubble schedules split a backward in two (tensor/split_backward.h): the
// input gradient (I), which the previous chunk waits for, and the weight gradients (W), which
// nobody waits for. Chunks are numbered along the model: chunk c holds the c-th of p * v
// consecutive layer ranges and lives on stage c % p, so with v > 1 each stage holds v chunks
// spread round-robin over the model (Megatron's interleaving).
#include <cstdint>
#include <ostream>
#include <vector>

namespace pipit {

enum class Phase {
  Forward,     // F
  Backward,    // B: the whole backward
  InputGrad,   // I: the input-gradient part of a backward
  WeightGrad,  // W: its weight-gradient part, after the I of the same microbatch and chunk
  // R: a forward run again just before its backward (activation recomputation). In traces
  // only: it is part of the B or I that follows, never a task of a schedule.
  Recompute
};
// 'F', 'B', 'I', 'W' or 'R'.
char phase_letter(Phase phase);

struct Task {
  int64_t step = 0;
  int microbatch = 0;
  int chunk = 0;
  Phase phase = Phase::Forward;
  int stage = 0;

  bool operator==(const Task&) const = default;
};

std::ostream& operator<<(std::ostream& out, const Task& task);  // "F3c1", "B3c1", "I3c1", "W3c1"

// One ordered task list per stage, for one optimizer step.
using Schedule = std::vector<std::vector<Task>>;

}  // namespace pipit
