#include "pipeline/schedules/schedule.h"

#include <algorithm>
#include <optional>
#include <sstream>

#include "tensor/error.h"

namespace pipit {

namespace {

void check_sizes(const char* function, int stages, int microbatches, int chunks_per_stage) {
  PIPIT_CHECK(stages >= 1 && microbatches >= 1 && chunks_per_stage >= 1, function,
              ": stages, microbatches and chunks per stage must be >= 1, got p = ", stages,
              ", m = ", microbatches, ", v = ", chunks_per_stage);
}

void check_costs(const char* function, double forward_cost, double backward_cost) {
  PIPIT_CHECK(forward_cost >= 0 && backward_cost >= 0, function,
              ": costs must be non-negative, got forward ", forward_cost, ", backward ",
              backward_cost);
}

constexpr const char* kScheduleNames =
    "\"gpipe\", \"1f1b\", \"interleaved\", \"zbh1\", \"zbh2\", \"zbv\", \"table\"";

Task make_task(Phase phase, int microbatch, int chunk, int stages,
               Placement placement = Placement::loop) {
  return Task{0, microbatch, chunk, phase, stage_of_chunk(chunk, stages, placement)};
}

}  // namespace

Schedule gpipe_schedule(int stages, int microbatches) {
  check_sizes("gpipe_schedule", stages, microbatches, 1);
  Schedule schedule(stages);
  for (int s = 0; s < stages; ++s) {
    for (Phase phase : {Phase::Forward, Phase::Backward}) {
      for (int mb = 0; mb < microbatches; ++mb) {
        schedule[s].push_back(make_task(phase, mb, s, stages));
      }
    }
  }
  return schedule;
}

Schedule one_f_one_b_schedule(int stages, int microbatches) {
  check_sizes("one_f_one_b_schedule", stages, microbatches, 1);
  Schedule schedule(stages);
  for (int s = 0; s < stages; ++s) {
    auto& tasks = schedule[s];
    const int warmup = std::min(stages - s - 1, microbatches);
    for (int mb = 0; mb < warmup; ++mb) tasks.push_back(make_task(Phase::Forward, mb, s, stages));
    for (int i = 0; i < microbatches - warmup; ++i) {
      tasks.push_back(make_task(Phase::Forward, warmup + i, s, stages));
      tasks.push_back(make_task(Phase::Backward, i, s, stages));
    }
    for (int mb = microbatches - warmup; mb < microbatches; ++mb) {
      tasks.push_back(make_task(Phase::Backward, mb, s, stages));
    }
  }
  return schedule;
}

Schedule interleaved_schedule(int stages, int microbatches, int chunks_per_stage) {
  check_sizes("interleaved_schedule", stages, microbatches, chunks_per_stage);
  PIPIT_CHECK(microbatches % stages == 0, "interleaved_schedule: microbatches (", microbatches,
              ") must be a multiple of stages (", stages, ")");
  // Megatron runs plain 1F1B when there are no virtual stages; its interleaved warm-up count
  // would be 2 (p - s - 1) at v == 1 (all of m at m == p), stashing more than 1F1B needs.
  if (chunks_per_stage == 1) return one_f_one_b_schedule(stages, microbatches);

  const int p = stages, v = chunks_per_stage;
  const int total = microbatches * v;  // virtual microbatches per stage
  const int group = p * v;
  Schedule schedule(p);
  for (int s = 0; s < p; ++s) {
    // Megatron's forward_backward_pipelining_with_interleaving: the k-th forward (backward)
    // walks p microbatches through each local chunk in turn, first (last) chunk first.
    auto virtual_task = [&](Phase phase, int k) {
      int local = (k % group) / p;
      if (phase == Phase::Backward) local = v - 1 - local;
      return make_task(phase, (k / group) * p + k % p, local * p + s, p);
    };
    const int warmup = microbatches == p ? total : std::min((p - s - 1) * 2 + (v - 1) * p, total);
    auto& tasks = schedule[s];
    for (int k = 0; k < warmup; ++k) tasks.push_back(virtual_task(Phase::Forward, k));
    for (int k = 0; k < total - warmup; ++k) {
      tasks.push_back(virtual_task(Phase::Forward, warmup + k));
      tasks.push_back(virtual_task(Phase::Backward, k));
    }
    for (int k = total - warmup; k < total; ++k) {
      tasks.push_back(virtual_task(Phase::Backward, k));
    }
  }
  return schedule;
}

Schedule forward_only_schedule(int stages, int microbatches, int chunks_per_stage,
                               Placement placement) {
  check_sizes("forward_only_schedule", stages, microbatches, chunks_per_stage);
  Schedule schedule(stages);
  for (int s = 0; s < stages; ++s) {
    for (int mb = 0; mb < microbatches; ++mb) {
      for (int local = 0; local < chunks_per_stage; ++local) {
        schedule[s].push_back(make_task(
            Phase::Forward, mb, global_chunk(s, local, stages, placement), stages, placement));
      }
    }
  }
  return schedule;
}

Schedule make_schedule(const std::string& name, int stages, int microbatches, int chunks_per_stage,
                       const std::string& table, int max_deferred) {
  check_sizes("make_schedule", stages, microbatches, chunks_per_stage);
  const bool zero_bubble = name == "zbh1" || name == "zbh2" || name == "zbv";
  PIPIT_CHECK(max_deferred >= 0,
              "make_schedule: max_deferred must be >= 0 (0: the schedule's own), got ",
              max_deferred);
  PIPIT_CHECK(max_deferred == 0 || zero_bubble, "make_schedule: max_deferred (", max_deferred,
              ") limits the deferred weight gradients of \"zbh1\", \"zbh2\" and \"zbv\", not \"",
              name, "\"");
  if (name == "table") {
    PIPIT_CHECK(!table.empty(),
                "make_schedule: \"table\" needs the table of tasks "
                "(PipelineConfig::schedule_table)");
    return parse_schedule_table(table, stages, microbatches, chunks_per_stage);
  }
  PIPIT_CHECK(table.empty(), "make_schedule: a table of tasks is given but the schedule is \"",
              name, "\"; name it \"table\" to run the table");
  if (name == "gpipe" || name == "1f1b") {
    PIPIT_CHECK(chunks_per_stage == 1, "make_schedule: \"", name,
                "\" runs one chunk per stage, got chunks_per_stage = ", chunks_per_stage,
                "; use \"interleaved\" for more");
    return name == "gpipe" ? gpipe_schedule(stages, microbatches)
                           : one_f_one_b_schedule(stages, microbatches);
  }
  if (name == "interleaved") return interleaved_schedule(stages, microbatches, chunks_per_stage);
  if (name == "zbh1" || name == "zbh2") {
    PIPIT_CHECK(chunks_per_stage == 1, "make_schedule: \"", name,
                "\" runs one chunk per stage, got chunks_per_stage = ", chunks_per_stage);
    return name == "zbh1" ? zb_h1_schedule(stages, microbatches, max_deferred)
                          : zb_h2_schedule(stages, microbatches, max_deferred);
  }
  if (name == "zbv") {
    PIPIT_CHECK(chunks_per_stage == 2, "make_schedule: \"zbv\" runs two chunks per stage, got ",
                "chunks_per_stage = ", chunks_per_stage);
    return zb_v_schedule(stages, microbatches, max_deferred);
  }
  throw Error(detail::concat("make_schedule: unknown schedule \"", name, "\"; valid names are ",
                             kScheduleNames));
}

namespace {

// validate_schedule's checks, each over the whole schedule; tasks are indexed by (phase,
// microbatch, chunk).
class ScheduleCheck {
 public:
  ScheduleCheck(const Schedule& schedule, int stages, int microbatches, int chunks_per_stage,
                Placement placement)
      : schedule_(schedule),
        stages_(stages),
        microbatches_(microbatches),
        chunks_(stages * chunks_per_stage),
        placement_(placement),
        seen_(kPhases * static_cast<size_t>(microbatches) * chunks_, 0) {}

  // Every task is a task of this run, on its chunk's stage, once; each chunk's forwards,
  // input gradients and weight-gradient sums in increasing microbatch order.
  void check_lists() {
    for (int s = 0; s < stages_; ++s) check_list(s);
  }
  // Every (microbatch, chunk) has its F, and its B or its I and W.
  void check_complete() const;
  // Runs the schedule with these costs per task, each as soon as its input and its stage are
  // free; throws naming the tasks that wait forever.
  ScheduleReport simulate(const double (&costs)[4]) const;

 private:
  static constexpr int kPhases = 4;
  size_t index(Phase phase, int microbatch, int chunk) const {
    return (static_cast<size_t>(phase) * microbatches_ + microbatch) * chunks_ + chunk;
  }
  size_t index(const Task& task) const { return index(task.phase, task.microbatch, task.chunk); }
  bool seen(Phase phase, int microbatch, int chunk) const {
    return seen_[index(phase, microbatch, chunk)] != 0;
  }
  Task task(Phase phase, int microbatch, int chunk) const {
    return make_task(phase, microbatch, chunk, stages_, placement_);
  }
  void check_list(int stage);
  void check_task(const Task& task, int stage);
  // What a task waits for: the activation or gradient it takes, or for W its own I.
  std::optional<Task> dependency(const Task& task) const;
  [[noreturn]] void deadlock(const std::vector<size_t>& next) const;

  const Schedule& schedule_;
  const int stages_, microbatches_, chunks_;
  const Placement placement_;
  std::vector<char> seen_;
};

void ScheduleCheck::check_task(const Task& task, int s) {
  PIPIT_CHECK(task.microbatch >= 0 && task.microbatch < microbatches_ && task.chunk >= 0 &&
                  task.chunk < chunks_ && static_cast<int>(task.phase) >= 0 &&
                  static_cast<int>(task.phase) < kPhases,
              "validate_schedule: unknown task ", task, " on stage ", s, " (m = ", microbatches_,
              ", ", chunks_, " chunks)");
  PIPIT_CHECK(stage_of_chunk(task.chunk, stages_, placement_) == s, "validate_schedule: task ",
              task, " is on stage ", s, " but chunk ", task.chunk, " lives on stage ",
              stage_of_chunk(task.chunk, stages_, placement_));
  PIPIT_CHECK(task.stage == s, "validate_schedule: task ", task, " in stage ", s,
              "'s list says stage ", task.stage);
  PIPIT_CHECK(!seen_[index(task)], "validate_schedule: task ", task, " appears twice on stage ", s);
  seen_[index(task)] = 1;
}

void ScheduleCheck::check_list(int s) {
  // Last microbatch per chunk of the tasks that must run in increasing microbatch order:
  // forwards; the tasks that send a gradient upstream (B, I); and the tasks that accumulate
  // weight gradients (B, W), whose order is the order of the sums.
  enum Order { kForward, kGradient, kAccumulate };
  std::vector<Task> last(3 * static_cast<size_t>(chunks_), Task{0, -1});
  for (const Task& task : schedule_[static_cast<size_t>(s)]) {
    check_task(task, s);
    std::vector<std::pair<Order, const char*>> orders;
    if (task.phase == Phase::Forward) orders.push_back({kForward, "forwards"});
    if (task.phase == Phase::Backward || task.phase == Phase::InputGrad) {
      orders.push_back({kGradient, "input gradients (B or I)"});
    }
    if (task.phase == Phase::Backward || task.phase == Phase::WeightGrad) {
      orders.push_back({kAccumulate, "weight gradients (B or W)"});
    }
    for (const auto& [order, what] : orders) {
      Task& previous = last[static_cast<size_t>(order) * chunks_ + task.chunk];
      PIPIT_CHECK(task.microbatch > previous.microbatch, "validate_schedule: stage ", s, " runs ",
                  task, " after ", previous, "; each chunk's ", what,
                  " must run in increasing microbatch order");
      previous = task;
    }
  }
}

void ScheduleCheck::check_complete() const {
  for (int mb = 0; mb < microbatches_; ++mb) {
    for (int c = 0; c < chunks_; ++c) {
      const char* missing = nullptr;
      Phase missing_phase = Phase::Forward;
      if (!seen(Phase::Forward, mb, c)) {
        missing = "";
      } else if (!seen(Phase::Backward, mb, c) && !seen(Phase::InputGrad, mb, c)) {
        const bool weight = seen(Phase::WeightGrad, mb, c);
        missing = weight ? "" : " (or its two parts, I and W)";
        missing_phase = weight ? Phase::InputGrad : Phase::Backward;
      } else if (seen(Phase::InputGrad, mb, c) && !seen(Phase::WeightGrad, mb, c)) {
        missing = "";
        missing_phase = Phase::WeightGrad;
      }
      PIPIT_CHECK(missing == nullptr, "validate_schedule: task ", task(missing_phase, mb, c),
                  " is missing from stage ", stage_of_chunk(c, stages_, placement_), missing);
    }
  }
}

std::optional<Task> ScheduleCheck::dependency(const Task& t) const {
  switch (t.phase) {
    case Phase::Forward:
      if (t.chunk == 0) return std::nullopt;
      return task(Phase::Forward, t.microbatch, t.chunk - 1);
    case Phase::WeightGrad:
      return task(Phase::InputGrad, t.microbatch, t.chunk);
    default:
      break;
  }
  if (t.chunk == chunks_ - 1) return task(Phase::Forward, t.microbatch, t.chunk);
  const bool split = seen(Phase::InputGrad, t.microbatch, t.chunk + 1);
  return task(split ? Phase::InputGrad : Phase::Backward, t.microbatch, t.chunk + 1);
}

ScheduleReport ScheduleCheck::simulate(const double (&costs)[4]) const {
  ScheduleReport report;
  report.peak_stashed.assign(stages_, 0);
  report.peak_deferred.assign(stages_, 0);
  std::vector<double> finish(seen_.size(), -1);  // -1: not run yet
  std::vector<size_t> next(stages_, 0);
  std::vector<double> free_at(stages_, 0);
  std::vector<int> stashed(stages_, 0), deferred(stages_, 0);
  size_t remaining = 0;
  for (const auto& tasks : schedule_) remaining += tasks.size();
  // Each task's time depends only on its stage predecessor and its dependency, so running
  // every stage as far as it can, round after round, gives the event-driven times.
  while (remaining > 0) {
    bool progressed = false;
    for (int s = 0; s < stages_; ++s) {
      for (; next[s] < schedule_[s].size(); ++next[s]) {
        const Task& t = schedule_[s][next[s]];
        const std::optional<Task> input = dependency(t);
        const double ready = input ? finish[index(*input)] : 0;
        if (ready < 0) break;
        free_at[s] = std::max(free_at[s], ready) + costs[static_cast<int>(t.phase)];
        finish[index(t)] = free_at[s];
        stashed[s] += t.phase == Phase::Forward ? 1 : t.phase == Phase::WeightGrad ? 0 : -1;
        deferred[s] += t.phase == Phase::InputGrad ? 1 : t.phase == Phase::WeightGrad ? -1 : 0;
        report.peak_stashed[s] = std::max(report.peak_stashed[s], stashed[s]);
        report.peak_deferred[s] = std::max(report.peak_deferred[s], deferred[s]);
        --remaining;
        progressed = true;
      }
    }
    if (!progressed) deadlock(next);
  }
  report.makespan = *std::max_element(free_at.begin(), free_at.end());
  return report;
}

void ScheduleCheck::deadlock(const std::vector<size_t>& next) const {
  std::ostringstream blocked;
  const char* separator = "";
  for (int s = 0; s < stages_; ++s) {
    if (next[s] == schedule_[s].size()) continue;
    const Task& t = schedule_[s][next[s]];
    blocked << separator << "stage " << s << " waits on " << *dependency(t) << " to run " << t;
    separator = "; ";
  }
  throw Error("validate_schedule: deadlock: " + blocked.str());
}

}  // namespace

ScheduleReport validate_schedule(const Schedule& schedule, int stages, int microbatches,
                                 int chunks_per_stage, double forward_cost, double backward_cost,
                                 double weight_share) {
  return validate_schedule(schedule, stages, microbatches, chunks_per_stage, Placement::loop,
                           forward_cost, backward_cost, weight_share);
}

ScheduleReport validate_schedule(const Schedule& schedule, int stages, int microbatches,
                                 int chunks_per_stage, Placement placement, double forward_cost,
                                 double backward_cost, double weight_share) {
  check_sizes("validate_schedule", stages, microbatches, chunks_per_stage);
  check_costs("validate_schedule", forward_cost, backward_cost);
  PIPIT_CHECK(weight_share >= 0 && weight_share <= 1,
              "validate_schedule: the weight-gradient share of a backward must be in [0, 1], got ",
              weight_share);
  PIPIT_CHECK(schedule.size() == static_cast<size_t>(stages),
              "validate_schedule: ", schedule.size(), " stage lists for ", stages, " stages");
  ScheduleCheck check(schedule, stages, microbatches, chunks_per_stage, placement);
  check.check_lists();
  check.check_complete();
  const double v = chunks_per_stage;
  const double weight_cost = weight_share * backward_cost;
  const double costs[4] = {forward_cost / v, backward_cost / v, (backward_cost - weight_cost) / v,
                           weight_cost / v};
  return check.simulate(costs);
}

double theoretical_step_time(const std::string& name, int stages, int microbatches,
                             int chunks_per_stage, double forward_cost, double backward_cost,
                             double weight_share) {
  check_sizes("theoretical_step_time", stages, microbatches, chunks_per_stage);
  check_costs("theoretical_step_time", forward_cost, backward_cost);
  const double pair = forward_cost + backward_cost;
  if (name == "gpipe" || name == "1f1b") return (microbatches + stages - 1) * pair;
  if (name == "interleaved") {
    return (microbatches + static_cast<double>(stages - 1) / chunks_per_stage) * pair;
  }
  const double w = weight_share * backward_cost, i = backward_cost - w;
  if (name == "zbh1" || name == "zbh2") {
    const double deferred = name == "zbh1" ? w : 2 * w;
    return microbatches * pair + (stages - 1) * std::max(forward_cost, forward_cost + i - deferred);
  }
  if (name == "zbv") return microbatches * pair + (stages - 1) * forward_cost / 2;
  throw Error(detail::concat("theoretical_step_time: unknown schedule \"", name,
                             "\"; valid names are ", kScheduleNames));
}

}  // namespace pipit
