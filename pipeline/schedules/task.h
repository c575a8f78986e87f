#pragma once
// Task: one unit of pipeline work, the forward or backward pass of one microbatch through one
// model chunk. Zero-bubble schedules split a backward in two (autograd/split_backward.h): the
// input gradient (I), which the previous chunk waits for, and the weight gradients (W), which
// nobody waits for. Chunks are numbered along the model: chunk c holds the c-th of p * v
// consecutive layer ranges. Where it lives is its Placement.
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace pipit {

enum class Phase {
  Forward,     // F
  Backward,    // B: the whole backward
  InputGrad,   // I: the input-gradient part of a backward
  WeightGrad,  // W: its weight-gradient part, after the I of the same microbatch and chunk
  // R: a forward run again just before its backward (activation recomputation). In traces
  // only: it is part of the B or I that follows, never a task of a schedule.
  Recompute,
  // S: the sum of the step's gradients over the stage's replica group (replica_group.h),
  // after its last task. In traces only.
  GradientSum
};
// 'F', 'B', 'I', 'W', 'R' or 'S'.
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

// Where chunks live. loop: chunk c on stage c % p, so with v > 1 each stage holds v chunks
// spread round-robin over the model (Megatron's interleaving). v (ZB-V, two chunks per stage):
// chunks 0..p-1 go down the stages and chunks p..2p-1 come back up, so stage s holds chunks s
// and 2p-1-s, the middle two share stage p-1 and the first and last share stage 0.
enum class Placement { loop, v };
// The placement a schedule runs on: v for "zbv", loop for every other.
Placement placement_of(const std::string& schedule);
int stage_of_chunk(int chunk, int stages, Placement placement);
// A stage's chunks in model order: local chunk l of `stage`, and a chunk's local index.
int global_chunk(int stage, int local, int stages, Placement placement);
int local_chunk(int chunk, int stages, Placement placement);

// One ordered task list per stage, for one optimizer step.
using Schedule = std::vector<std::vector<Task>>;

}  // namespace pipit
