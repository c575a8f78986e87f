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
  const int chunks = stages * chunks_per_stage;
  constexpr int kPhases = 4;
  const size_t task_count = kPhases * static_cast<size_t>(microbatches) * chunks;
  auto index = [&](Phase phase, int microbatch, int chunk) {
    return (static_cast<size_t>(phase) * microbatches + microbatch) * chunks + chunk;
  };
  auto index_of = [&](const Task& task) { return index(task.phase, task.microbatch, task.chunk); };

  std::vector<char> seen(task_count, 0);
  for (int s = 0; s < stages; ++s) {
    // Last microbatch per chunk of the tasks that must run in increasing microbatch order:
    // forwards; the tasks that send a gradient upstream (B, I); and the tasks that accumulate
    // weight gradients (B, W), whose order is the order of the sums.
    enum Order { kForward, kGradient, kAccumulate };
    std::vector<Task> last(3 * static_cast<size_t>(chunks), Task{0, -1});
    for (const Task& task : schedule[s]) {
      PIPIT_CHECK(task.microbatch >= 0 && task.microbatch < microbatches && task.chunk >= 0 &&
                      task.chunk < chunks && static_cast<int>(task.phase) >= 0 &&
                      static_cast<int>(task.phase) < kPhases,
                  "validate_schedule: unknown task ", task, " on stage ", s, " (m = ", microbatches,
                  ", ", chunks, " chunks)");
      PIPIT_CHECK(stage_of_chunk(task.chunk, stages, placement) == s, "validate_schedule: task ",
                  task, " is on stage ", s, " but chunk ", task.chunk, " lives on stage ",
                  stage_of_chunk(task.chunk, stages, placement));
      PIPIT_CHECK(task.stage == s, "validate_schedule: task ", task, " in stage ", s,
                  "'s list says stage ", task.stage);
      PIPIT_CHECK(!seen[index_of(task)], "validate_schedule: task ", task,
                  " appears twice on stage ", s);
      seen[index_of(task)] = 1;
      std::vector<std::pair<Order, const char*>> orders;
      if (task.phase == Phase::Forward) orders.push_back({kForward, "forwards"});
      if (task.phase == Phase::Backward || task.phase == Phase::InputGrad) {
        orders.push_back({kGradient, "input gradients (B or I)"});
      }
      if (task.phase == Phase::Backward || task.phase == Phase::WeightGrad) {
        orders.push_back({kAccumulate, "weight gradients (B or W)"});
      }
      for (const auto& [order, what] : orders) {
        Task& previous = last[static_cast<size_t>(order) * chunks + task.chunk];
        PIPIT_CHECK(task.microbatch > previous.microbatch, "validate_schedule: stage ", s, " runs ",
                    task, " after ", previous, "; each chunk's ", what,
                    " must run in increasing microbatch order");
        previous = task;
      }
    }
  }
  for (int mb = 0; mb < microbatches; ++mb) {
    for (int c = 0; c < chunks; ++c) {
      auto has = [&](Phase phase) { return seen[index(phase, mb, c)] != 0; };
      const char* missing = nullptr;
      Phase missing_phase = Phase::Forward;
      if (!has(Phase::Forward)) {
        missing = "";
      } else if (!has(Phase::Backward) && !has(Phase::InputGrad)) {
        missing = has(Phase::WeightGrad) ? "" : " (or its two parts, I and W)";
        missing_phase = has(Phase::WeightGrad) ? Phase::InputGrad : Phase::Backward;
      } else if (has(Phase::InputGrad) && !has(Phase::WeightGrad)) {
        missing = "";
        missing_phase = Phase::WeightGrad;
      }
      PIPIT_CHECK(missing == nullptr, "validate_schedule: task ",
                  make_task(missing_phase, mb, c, stages, placement), " is missing from stage ",
                  stage_of_chunk(c, stages, placement), missing);
    }
  }

  // What a task waits for: the activation or gradient it takes, or for W its own I.
  auto dependency = [&](const Task& task) -> std::optional<Task> {
    switch (task.phase) {
      case Phase::Forward:
        if (task.chunk == 0) return std::nullopt;
        return make_task(Phase::Forward, task.microbatch, task.chunk - 1, stages, placement);
      case Phase::WeightGrad:
        return make_task(Phase::InputGrad, task.microbatch, task.chunk, stages, placement);
      default:
        break;
    }
    if (task.chunk == chunks - 1) {
      return make_task(Phase::Forward, task.microbatch, task.chunk, stages, placement);
    }
    const bool split = seen[index(Phase::InputGrad, task.microbatch, task.chunk + 1)] != 0;
    return make_task(split ? Phase::InputGrad : Phase::Backward, task.microbatch, task.chunk + 1,
                     stages, placement);
  };
  const double v = chunks_per_stage;
  const double weight_cost = weight_share * backward_cost;
  const double costs[kPhases] = {forward_cost / v, backward_cost / v,
                                 (backward_cost - weight_cost) / v, weight_cost / v};

  ScheduleReport report;
  report.peak_stashed.assign(stages, 0);
  report.peak_deferred.assign(stages, 0);
  std::vector<double> finish(task_count, -1);  // -1: not run yet
  std::vector<size_t> next(stages, 0);
  std::vector<double> free_at(stages, 0);
  std::vector<int> stashed(stages, 0), deferred(stages, 0);
  size_t remaining = 0;
  for (const auto& tasks : schedule) remaining += tasks.size();
  // Each task's time depends only on its stage predecessor and its dependency, so running
  // every stage as far as it can, round after round, gives the event-driven times.
  while (remaining > 0) {
    bool progressed = false;
    for (int s = 0; s < stages; ++s) {
      for (; next[s] < schedule[s].size(); ++next[s]) {
        const Task& task = schedule[s][next[s]];
        const std::optional<Task> input = dependency(task);
        double ready = 0;
        if (input) {
          ready = finish[index_of(*input)];
          if (ready < 0) break;
        }
        free_at[s] = std::max(free_at[s], ready) + costs[static_cast<int>(task.phase)];
        finish[index_of(task)] = free_at[s];
        stashed[s] += task.phase == Phase::Forward ? 1 : task.phase == Phase::WeightGrad ? 0 : -1;
        deferred[s] += task.phase == Phase::InputGrad    ? 1
                       : task.phase == Phase::WeightGrad ? -1
                                                         : 0;
        report.peak_stashed[s] = std::max(report.peak_stashed[s], stashed[s]);
        report.peak_deferred[s] = std::max(report.peak_deferred[s], deferred[s]);
        --remaining;
        progressed = true;
      }
    }
    if (!progressed) {
      std::ostringstream blocked;
      const char* separator = "";
      for (int s = 0; s < stages; ++s) {
        if (next[s] == schedule[s].size()) continue;
        const Task& task = schedule[s][next[s]];
        blocked << separator << "stage " << s << " waits on " << *dependency(task) << " to run "
                << task;
        separator = "; ";
      }
      throw Error("validate_schedule: deadlock: " + blocked.str());
    }
  }
  report.makespan = *std::max_element(free_at.begin(), free_at.end());
  return report;
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
