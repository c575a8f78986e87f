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

// The pipeline run with unit costs (F, I and W alike), one task at a time: the task, of any
// stage, that can start first.
class ZeroBubbleSimulation {
 public:
  ZeroBubbleSimulation(int stages, int microbatches, int chunks_per_stage, Placement placement,
                       const Limits& limits)
      : p_(stages),
        m_(microbatches),
        chunks_(stages * chunks_per_stage),
        limits_(limits),
        forward_done_(chunks_, std::vector<double>(microbatches, kNever)),
        input_grad_done_(chunks_, std::vector<double>(microbatches, kNever)),
        next_f_(chunks_, 0),
        next_i_(chunks_, 0),
        next_w_(chunks_, 0),
        free_at_(stages, 0),
        stage_chunks_(stages),
        schedule_(stages) {
    // A stage offers its later chunks first: they are nearer the loss, and the gradient that
    // comes back from it.
    for (int s = 0; s < p_; ++s) {
      for (int local = chunks_per_stage - 1; local >= 0; --local) {
        stage_chunks_[s].push_back(global_chunk(s, local, p_, placement));
      }
    }
  }

  Schedule run() {
    for (int64_t left = int64_t{3} * chunks_ * m_; left > 0; --left) {
      Candidate best;
      for (int s = 0; s < p_; ++s) offer(s, best);
      PIPIT_CHECK(best.stage >= 0, "zero-bubble schedule: no stage can run (p = ", p_, ", m = ", m_,
                  ")");
      take(best);
    }
    return std::move(schedule_);
  }

 private:
  static constexpr double kCost = 1.0;
  static constexpr double kNever = std::numeric_limits<double>::infinity();
  struct Candidate {
    double start = kNever;
    int stage = -1, chunk = -1;
    Phase phase = Phase::Forward;
  };

  // Stage s's tasks that may run next, each kept in `best` if it starts earlier. Ties between
  // stages go to the lower stage, within a stage to I, then F, then W, and the later chunk:
  // the order the candidates are offered in.
  void offer(int s, Candidate& best) const {
    int activations = 0, deferred = 0;
    for (int c : stage_chunks_[s]) {
      activations += next_f_[c] - next_i_[c];
      deferred += next_i_[c] - next_w_[c];
    }
    const bool must_run_w = deferred >= limits_.deferred[s];
    auto consider = [&](Phase phase, int c, double input_ready) {
      const double start = std::max(free_at_[s], input_ready);
      if (start < best.start) best = {start, s, c, phase};
    };
    for (int c : stage_chunks_[s]) {
      if (must_run_w || next_i_[c] >= next_f_[c]) continue;
      const int mb = next_i_[c];
      consider(Phase::InputGrad, c,
               c == chunks_ - 1 ? forward_done_[c][mb] : input_grad_done_[c + 1][mb]);
    }
    for (int c : stage_chunks_[s]) {
      if (must_run_w || next_f_[c] >= m_ || activations >= limits_.activations[s]) continue;
      consider(Phase::Forward, c, c == 0 ? 0.0 : forward_done_[c - 1][next_f_[c]]);
    }
    for (int c : stage_chunks_[s]) {
      if (next_w_[c] < next_i_[c]) consider(Phase::WeightGrad, c, free_at_[s]);
    }
  }

  void take(const Candidate& task) {
    const int c = task.chunk;
    int mb = 0;
    switch (task.phase) {
      case Phase::Forward:
        mb = next_f_[c]++;
        forward_done_[c][mb] = task.start + kCost;
        break;
      case Phase::InputGrad:
        mb = next_i_[c]++;
        input_grad_done_[c][mb] = task.start + kCost;
        break;
      default:
        mb = next_w_[c]++;
        break;
    }
    free_at_[task.stage] = task.start + kCost;
    schedule_[task.stage].push_back(Task{0, mb, c, task.phase, task.stage});
  }

  const int p_, m_, chunks_;
  const Limits& limits_;
  // Per chunk and microbatch: when its F and its I ended (kNever: not yet).
  std::vector<std::vector<double>> forward_done_, input_grad_done_;
  std::vector<int> next_f_, next_i_, next_w_;
  std::vector<double> free_at_;
  std::vector<std::vector<int>> stage_chunks_;
  Schedule schedule_;
};

Schedule simulate_zero_bubble(int stages, int microbatches, int chunks_per_stage,
                              Placement placement, const Limits& limits) {
  PIPIT_CHECK(stages >= 1 && microbatches >= 1,
              "zero-bubble schedule: stages and microbatches must be >= 1, got p = ", stages,
              ", m = ", microbatches);
  return ZeroBubbleSimulation(stages, microbatches, chunks_per_stage, placement, limits).run();
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
