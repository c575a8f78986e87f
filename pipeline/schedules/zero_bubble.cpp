// ZB-H1, ZB-H2 and ZB-V (pipeline/schedules/schedule.h), built by simulating the pipeline with unit
// costs. The memory limits are what make them differ: with no limit a stage would run every forward
// first and keep every weight gradient for the end (GPipe's memory), with 1F1B's limits and no
// split it would be 1F1B.
#include <limits>

#include "pipeline/schedules/schedule.h"
#include "tensor/error.h"

namespace pipit {
namespace {

struct Limits {
  // Per stage, over all its chunks: most microbatches between their F and their I, and between
  // their I and their W.
  std::vector<int> activations, deferred;
};

Schedule simulate_zero_bubble(int stages, int microbatches, int chunks_per_stage,
                              Placement placement, const Limits& limits) {
  PIPIT_CHECK(stages >= 1 && microbatches >= 1,
              "zero-bubble schedule: stages and microbatches must be >= 1, got p = ", stages,
              ", m = ", microbatches);
  const int p = stages, m = microbatches, chunks = p * chunks_per_stage;
  constexpr double kCost = 1.0;  // F, I and W alike
  constexpr double kNever = std::numeric_limits<double>::infinity();
  // Per chunk and microbatch: when its F and its I ended (kNever: not yet).
  std::vector<std::vector<double>> forward_done(chunks, std::vector<double>(m, kNever));
  std::vector<std::vector<double>> input_grad_done(chunks, std::vector<double>(m, kNever));
  std::vector<int> next_f(chunks, 0), next_i(chunks, 0), next_w(chunks, 0);
  std::vector<double> free_at(p, 0);
  // A stage offers its later chunks first: they are nearer the loss, and the gradient that
  // comes back from it.
  std::vector<std::vector<int>> stage_chunks(p);
  for (int s = 0; s < p; ++s) {
    for (int local = chunks_per_stage - 1; local >= 0; --local) {
      stage_chunks[s].push_back(global_chunk(s, local, p, placement));
    }
  }
  Schedule schedule(p);
  for (int64_t left = int64_t{3} * chunks * m; left > 0; --left) {
    // The stage whose best task starts first, and that task.
    double best_start = kNever;
    int best_stage = -1, best_chunk = -1;
    Phase best_phase = Phase::Forward;
    for (int s = 0; s < p; ++s) {
      int activations = 0, deferred = 0;
      for (int c : stage_chunks[s]) {
        activations += next_f[c] - next_i[c];
        deferred += next_i[c] - next_w[c];
      }
      const bool must_run_w = deferred >= limits.deferred[s];
      auto consider = [&](Phase phase, int c, double input_ready) {
        const double start = std::max(free_at[s], input_ready);
        // Ties between stages go to the lower stage, within a stage to I, then F, then W, and
        // the later chunk: the order the candidates are offered in.
        if (start < best_start) {
          best_start = start;
          best_stage = s;
          best_chunk = c;
          best_phase = phase;
        }
      };
      for (int c : stage_chunks[s]) {
        if (must_run_w || next_i[c] >= next_f[c]) continue;
        const int mb = next_i[c];
        consider(Phase::InputGrad, c,
                 c == chunks - 1 ? forward_done[c][mb] : input_grad_done[c + 1][mb]);
      }
      for (int c : stage_chunks[s]) {
        if (must_run_w || next_f[c] >= m || activations >= limits.activations[s]) continue;
        consider(Phase::Forward, c, c == 0 ? 0.0 : forward_done[c - 1][next_f[c]]);
      }
      for (int c : stage_chunks[s]) {
        if (next_w[c] < next_i[c]) consider(Phase::WeightGrad, c, free_at[s]);
      }
    }
    PIPIT_CHECK(best_stage >= 0, "zero-bubble schedule: no stage can run (p = ", p, ", m = ", m,
                ")");
    const int s = best_stage, c = best_chunk;
    int mb = 0;
    switch (best_phase) {
      case Phase::Forward:
        mb = next_f[c]++;
        forward_done[c][mb] = best_start + kCost;
        break;
      case Phase::InputGrad:
        mb = next_i[c]++;
        input_grad_done[c][mb] = best_start + kCost;
        break;
      default:
        mb = next_w[c]++;
        break;
    }
    free_at[s] = best_start + kCost;
    schedule[s].push_back(Task{0, mb, c, best_phase, s});
  }
  return schedule;
}

}  // namespace

Schedule zb_h1_schedule(int stages, int microbatches, int max_deferred) {
  Limits limits;
  for (int s = 0; s < stages; ++s) {
    limits.activations.push_back(stages - s);
    limits.deferred.push_back(max_deferred > 0 ? max_deferred : stages);
  }
  return simulate_zero_bubble(stages, microbatches, 1, Placement::loop, limits);
}

Schedule zb_h2_schedule(int stages, int microbatches, int max_deferred) {
  Limits limits;
  for (int s = 0; s < stages; ++s) {
    limits.activations.push_back(2 * (stages - s) - 1);
    limits.deferred.push_back(max_deferred > 0 ? max_deferred : 2 * stages);
  }
  return simulate_zero_bubble(stages, microbatches, 1, Placement::loop, limits);
}

Schedule zb_v_schedule(int stages, int microbatches, int max_deferred) {
  Limits limits;
  for (int s = 0; s < stages; ++s) {
    limits.activations.push_back(2 * stages);
    limits.deferred.push_back(max_deferred > 0 ? max_deferred : stages);
  }
  return simulate_zero_bubble(stages, microbatches, 2, Placement::v, limits);
}

}  // namespace pipit
