// ZB-H1 and ZB-H2 (pipeline/schedule.h), built by simulating the pipeline with unit costs. The
// memory limits are what make them differ: with no limit a stage would run every forward first
// and keep every weight gradient for the end (GPipe's memory), with 1F1B's limits and no split
// it would be 1F1B.
#include <limits>

#include "pipeline/schedule.h"
#include "tensor/error.h"

namespace pipit {
namespace {

struct Limits {
  // Per stage: most microbatches between their F and their I, and between their I and their W.
  std::vector<int> activations, deferred;
};

Schedule simulate_zero_bubble(int stages, int microbatches, const Limits& limits) {
  PIPIT_CHECK(stages >= 1 && microbatches >= 1,
              "zero-bubble schedule: stages and microbatches must be >= 1, got p = ", stages,
              ", m = ", microbatches);
  const int p = stages, m = microbatches;
  constexpr double kCost = 1.0;  // F, I and W alike
  constexpr double kNever = std::numeric_limits<double>::infinity();
  // finished[phase][stage][microbatch]: when F or I ended (kNever: not yet).
  std::vector<std::vector<double>> forward_done(p, std::vector<double>(m, kNever));
  std::vector<std::vector<double>> input_grad_done(p, std::vector<double>(m, kNever));
  std::vector<int> next_f(p, 0), next_i(p, 0), next_w(p, 0);
  std::vector<double> free_at(p, 0);
  Schedule schedule(p);
  for (int64_t left = int64_t{3} * p * m; left > 0; --left) {
    // The stage whose best task starts first, and that task.
    double best_start = kNever;
    int best_stage = -1;
    Phase best_phase = Phase::Forward;
    for (int s = 0; s < p; ++s) {
      auto consider = [&](Phase phase, double input_ready) {
        const double start = std::max(free_at[s], input_ready);
        // Ties between stages go to the lower stage, within a stage to I, then F, then W: the
        // order the candidates are offered in.
        if (start < best_start) {
          best_start = start;
          best_stage = s;
          best_phase = phase;
        }
      };
      const bool must_run_w = next_i[s] - next_w[s] >= limits.deferred[s];
      if (!must_run_w && next_i[s] < next_f[s]) {
        const int mb = next_i[s];
        consider(Phase::InputGrad, s == p - 1 ? forward_done[s][mb] : input_grad_done[s + 1][mb]);
      }
      if (!must_run_w && next_f[s] < m && next_f[s] - next_i[s] < limits.activations[s]) {
        const int mb = next_f[s];
        consider(Phase::Forward, s == 0 ? 0.0 : forward_done[s - 1][mb]);
      }
      if (next_w[s] < next_i[s]) consider(Phase::WeightGrad, free_at[s]);
    }
    PIPIT_CHECK(best_stage >= 0, "zero-bubble schedule: no stage can run (p = ", p, ", m = ", m,
                ")");
    const int s = best_stage;
    int mb = 0;
    switch (best_phase) {
      case Phase::Forward:
        mb = next_f[s]++;
        forward_done[s][mb] = best_start + kCost;
        break;
      case Phase::InputGrad:
        mb = next_i[s]++;
        input_grad_done[s][mb] = best_start + kCost;
        break;
      default:
        mb = next_w[s]++;
        break;
    }
    free_at[s] = best_start + kCost;
    schedule[s].push_back(Task{0, mb, s, best_phase, s});
  }
  return schedule;
}

}  // namespace

Schedule zb_h1_schedule(int stages, int microbatches) {
  Limits limits;
  for (int s = 0; s < stages; ++s) {
    limits.activations.push_back(stages - s);
    limits.deferred.push_back(stages);
  }
  return simulate_zero_bubble(stages, microbatches, limits);
}

Schedule zb_h2_schedule(int stages, int microbatches) {
  Limits limits;
  for (int s = 0; s < stages; ++s) {
    limits.activations.push_back(2 * (stages - s) - 1);
    limits.deferred.push_back(2 * stages);
  }
  return simulate_zero_bubble(stages, microbatches, limits);
}

}  // namespace pipit
