#include "pipeline/rebalancing/rebalance.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>
#include <utility>

#include "tensor/error.h"

namespace pipit {

namespace {

// Stage times this close (relative) differ by rounding, not by anything measured.
constexpr double kSameTime = 1e-9;
constexpr double kInfeasible = std::numeric_limits<double>::infinity();

std::string fixed(double value, int decimals) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(decimals) << value;
  return out.str();
}

std::string percent(double fraction) {
  return fixed(100 * fraction, 1) + "%";
}

double median(std::vector<double> values) {
  const size_t middle = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(middle),
                   values.end());
  if (values.size() % 2 == 1) return values[middle];
  const double below =
      *std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(middle));
  return (below + values[middle]) / 2;
}

// The smallest possible slowest-stage time over the partitions of the model into one chunk
// of >= 1 layer per stage.
double fastest_slowest_stage_ms(const CostModel& model) {
  const size_t n = model.layers(), p = static_cast<size_t>(model.stages());
  // slowest[s * (n + 1) + i]: the best for stages s..p-1 holding layers [i, n).
  std::vector<double> slowest(p * (n + 1), kInfeasible);
  auto at = [&](size_t stage, size_t i) -> double& { return slowest[stage * (n + 1) + i]; };
  for (size_t i = 0; i < n; ++i) at(p - 1, i) = model.chunk_ms(static_cast<int>(p - 1), {i, n});
  for (size_t s = p - 1; s-- > 0;) {
    const size_t later_stages = p - 1 - s;
    for (size_t i = 0; i + later_stages < n; ++i) {
      for (size_t end = i + 1; end + later_stages <= n; ++end) {
        const double chunk_ms = model.chunk_ms(static_cast<int>(s), {i, end});
        at(s, i) = std::min(at(s, i), std::max(chunk_ms, at(s + 1, end)));
      }
    }
  }
  return at(0, 0);
}

// [stage * (n + 1) + i]: the link bytes for stage s to take layers [0, i), each layer's state
// once per stage it crosses from where `current` has it.
std::vector<double> link_bytes_before(const std::vector<LayerRange>& current,
                                      const std::vector<double>& state_bytes, size_t p, size_t n) {
  std::vector<size_t> stage_now(n);
  for (size_t s = 0; s < p; ++s) {
    for (size_t l = current[s].begin; l < current[s].end; ++l) stage_now[l] = s;
  }
  std::vector<double> before(p * (n + 1), 0.0);
  for (size_t s = 0; s < p; ++s) {
    for (size_t l = 0; l < n; ++l) {
      const size_t hops = std::max(s, stage_now[l]) - std::min(s, stage_now[l]);
      before[s * (n + 1) + l + 1] =
          before[s * (n + 1) + l] + static_cast<double>(hops) * state_bytes[l];
    }
  }
  return before;
}

}  // namespace

std::vector<LayerRange> optimal_partition(const CostModel& model,
                                          const std::vector<LayerRange>& current,
                                          const std::vector<double>& state_bytes) {
  const char* caller = "optimal_partition";
  const size_t n = model.layers(), p = static_cast<size_t>(model.stages());
  PIPIT_CHECK(p <= n, caller, ": ", p, " stages need at least ", p, " layers, but the model has ",
              n);
  check_partition(caller, current, n, p);
  check_layer_values(caller, "state_bytes", state_bytes, n);
  const double limit = fastest_slowest_stage_ms(model) * (1 + kSameTime);

  // Among the partitions whose stages all fit within `limit`: the fewest link bytes (a
  // layer's state once per stage it crosses, as estimate_migration counts them), then each cut
  // as early as possible. Tables are indexed [stage * (n + 1) + layer].
  auto index = [n](size_t stage, size_t i) { return stage * (n + 1) + i; };
  const std::vector<double> moved_before = link_bytes_before(current, state_bytes, p, n);
  auto moved = [&](size_t stage, size_t begin, size_t end) {
    return moved_before[index(stage, end)] - moved_before[index(stage, begin)];
  };
  auto fits = [&](size_t stage, size_t begin, size_t end) {
    return model.chunk_ms(static_cast<int>(stage), {begin, end}) <= limit;
  };
  // fewest[(s, i)]: the fewest link bytes for stages s..p-1 to take layers [i, n) within
  // `limit`, with stage s's chunk ending at chunk_end[(s, i)].
  std::vector<double> fewest(p * (n + 1), kInfeasible);
  std::vector<size_t> chunk_end(p * (n + 1), n);
  for (size_t i = 0; i < n; ++i) {
    if (fits(p - 1, i, n)) fewest[index(p - 1, i)] = moved(p - 1, i, n);
  }
  for (size_t s = p - 1; s-- > 0;) {
    const size_t later_stages = p - 1 - s;
    for (size_t i = 0; i + later_stages < n; ++i) {
      for (size_t end = i + 1; end + later_stages <= n; ++end) {
        if (fewest[index(s + 1, end)] == kInfeasible || !fits(s, i, end)) continue;
        const double total = moved(s, i, end) + fewest[index(s + 1, end)];
        if (total < fewest[index(s, i)]) {
          fewest[index(s, i)] = total;
          chunk_end[index(s, i)] = end;
        }
      }
    }
  }
  std::vector<LayerRange> ranges;
  for (size_t s = 0, begin = 0; s < p; ++s) {
    ranges.push_back({begin, chunk_end[index(s, begin)]});
    begin = ranges.back().end;
  }
  return ranges;
}

std::string Decision::reason() const {
  std::string speeds;
  for (double speed : stage_speed) {
    // Appended in two steps: GCC 12 warns falsely (-Wrestrict) on " " + string here.
    speeds += ' ';
    speeds += fixed(speed, 2);
  }
  return "remap " + ranges_str(from) + " -> " + ranges_str(to) + ": slowest stage " +
         fixed(current_slowest_ms, 2) + " -> " + fixed(new_slowest_ms, 2) + " ms per microbatch (" +
         percent(gain) + " faster), moves " + fixed(migration.bytes / 1e6, 1) + " MB (" +
         fixed(migration.ms, 1) + " ms), pays back in " + fixed(payback_steps, 1) +
         " steps; fitted stage speeds" + speeds;
}

RebalancePolicy::RebalancePolicy(RebalanceConfig config, int stages, int chunks_per_stage,
                                 std::vector<std::string> layer_kinds)
    : config_(config),
      stages_(stages),
      chunks_per_stage_(chunks_per_stage),
      layer_kinds_(std::move(layer_kinds)) {
  const char* caller = "RebalancePolicy";
  PIPIT_CHECK(stages >= 1 && chunks_per_stage >= 1, caller,
              ": stages and chunks per stage must be >= 1, got p = ", stages,
              ", v = ", chunks_per_stage);
  const size_t chunks = static_cast<size_t>(stages) * static_cast<size_t>(chunks_per_stage);
  PIPIT_CHECK(chunks <= layer_kinds_.size(), caller, ": ", stages, " stages x ", chunks_per_stage,
              " chunks per stage = ", chunks, " chunks, but the model has only ",
              layer_kinds_.size(), " layers");
  PIPIT_CHECK(config_.window >= 1, caller, ": window must be >= 1 step, got ", config_.window);
  PIPIT_CHECK(std::isfinite(config_.threshold) && config_.threshold >= 0, caller,
              ": threshold must be finite and >= 0, got ", config_.threshold);
  PIPIT_CHECK(config_.cooldown >= 0, caller, ": cooldown must be >= 0 steps, got ",
              config_.cooldown);
  PIPIT_CHECK(config_.payback_steps >= 0, caller, ": payback_steps must be >= 0, got ",
              config_.payback_steps);
  PIPIT_CHECK(std::isfinite(config_.link_ms_per_mb) && config_.link_ms_per_mb >= 0, caller,
              ": link_ms_per_mb must be finite and >= 0, got ", config_.link_ms_per_mb);
  PIPIT_CHECK(!config_.enabled || chunks_per_stage == 1, caller,
              ": automatic rebalancing supports v = 1 chunk per stage, got v = ", chunks_per_stage,
              "; with v > 1 a stage's time sums chunks spread along the model, which "
              "optimal_partition does not solve (manual remaps work with any v)");
}

std::optional<Decision> RebalancePolicy::observe(int64_t step,
                                                 const std::vector<LayerRange>& current,
                                                 const LayerCosts& step_costs, int microbatches) {
  const char* caller = "RebalancePolicy::observe";
  if (!config_.enabled) {
    verdict_ = "automatic rebalancing is disabled";
    return std::nullopt;
  }
  PIPIT_CHECK(!last_step_ || step > *last_step_, caller, ": step ", step,
              " does not come after step ", *last_step_);
  check_partition(caller, current, layer_kinds_.size(),
                  static_cast<size_t>(stages_) * static_cast<size_t>(chunks_per_stage_));
  check_layer_costs(caller, step_costs, layer_kinds_.size());
  PIPIT_CHECK(microbatches >= 1, caller, ": microbatches must be >= 1, got ", microbatches);
  last_step_ = step;
  last_observed_ = current;

  if (last_remap_step_ && step <= *last_remap_step_ + config_.cooldown) {
    verdict_ =
        detail::concat("cooling down after the remap at step ", *last_remap_step_,
                       ": measuring again from step ", *last_remap_step_ + config_.cooldown + 1);
    return std::nullopt;
  }
  if (current != window_partition_) {
    window_.clear();
    window_partition_ = current;
  }
  window_.push_back(step_costs);
  if (window_.size() > static_cast<size_t>(config_.window)) window_.pop_front();
  if (window_.size() < static_cast<size_t>(config_.window)) {
    verdict_ = detail::concat("measuring ", ranges_str(current), ": ", window_.size(), " of ",
                              config_.window, " steps");
    return std::nullopt;
  }
  return judge(current, microbatches);
}

void RebalancePolicy::remapped(int64_t step, std::vector<LayerRange> now) {
  const char* caller = "RebalancePolicy::remapped";
  PIPIT_CHECK(!last_step_ || step >= *last_step_, caller, ": step ", step, " comes before step ",
              *last_step_, ", already observed");
  check_partition(caller, now, layer_kinds_.size(),
                  static_cast<size_t>(stages_) * static_cast<size_t>(chunks_per_stage_));
  if (!last_observed_.empty() && last_observed_ != now) left_at_last_remap_ = last_observed_;
  last_step_ = last_remap_step_ = step;
  last_observed_ = now;
  window_.clear();
  window_partition_ = std::move(now);
}

std::optional<Decision> RebalancePolicy::judge(const std::vector<LayerRange>& current,
                                               int microbatches) {
  const LayerCosts medians = median_layer_costs({window_.begin(), window_.end()});
  const CostModel model =
      CostModel::fit(layer_kinds_, current, stages_, medians, config_.link_ms_per_mb);
  Decision decision;
  decision.from = current;
  decision.to = optimal_partition(model, current, medians.state_bytes);
  decision.current_slowest_ms = model.slowest_stage_ms(current);
  decision.new_slowest_ms = model.slowest_stage_ms(decision.to);
  decision.stage_speed = model.stage_speed();
  if (decision.to == current) {
    verdict_ = "keeping " + ranges_str(current) + ": no partition is predicted faster than its " +
               fixed(decision.current_slowest_ms, 2) + " ms per microbatch";
    return std::nullopt;
  }
  decision.gain =
      decision.current_slowest_ms > 0
          ? (decision.current_slowest_ms - decision.new_slowest_ms) / decision.current_slowest_ms
          : 0;
  const bool undoes_last_remap = decision.to == left_at_last_remap_;
  const double needed = undoes_last_remap ? 2 * config_.threshold : config_.threshold;
  if (!(decision.gain > needed)) {
    verdict_ = "keeping " + ranges_str(current) + ": the best partition " +
               ranges_str(decision.to) + " gains " + percent(decision.gain) + ", not more than " +
               percent(needed) +
               (undoes_last_remap ? " (twice the threshold, to undo the last remap)" : "");
    return std::nullopt;
  }
  // A gain that shows in the medians but not in most steps alone is noise; one step in eight
  // may be an outlier.
  const size_t agreeing = steps_showing_gain(current, decision.to, needed);
  const size_t quorum = window_.size() - window_.size() / 8;
  if (agreeing < quorum) {
    verdict_ = "keeping " + ranges_str(current) + ": the best partition " +
               ranges_str(decision.to) + " gains " + percent(decision.gain) +
               " on the window's medians, but more than " + percent(needed) + " in only " +
               std::to_string(agreeing) + " of its " + std::to_string(window_.size()) +
               " steps alone (" + std::to_string(quorum) + " needed)";
    return std::nullopt;
  }
  decision.migration = estimate_migration(current, decision.to, stages_, medians.state_bytes,
                                          config_.link_ms_per_mb);
  const double saved_ms_per_step = predict_step_ms(model, current, microbatches) -
                                   predict_step_ms(model, decision.to, microbatches);
  decision.payback_steps = decision.migration.ms / saved_ms_per_step;
  if (decision.payback_steps > config_.payback_steps) {
    verdict_ = "declined, pays back in " + fixed(decision.payback_steps, 1) + " steps, more than " +
               std::to_string(config_.payback_steps) + ": " + decision.reason();
    return std::nullopt;
  }
  window_.clear();
  verdict_ = decision.reason();
  return decision;
}

size_t RebalancePolicy::steps_showing_gain(const std::vector<LayerRange>& current,
                                           const std::vector<LayerRange>& to, double needed) const {
  size_t agreeing = 0;
  for (const LayerCosts& step : window_) {
    const CostModel model =
        CostModel::fit(layer_kinds_, current, stages_, step, config_.link_ms_per_mb);
    const double now_ms = model.slowest_stage_ms(current);
    if (now_ms > 0 && (now_ms - model.slowest_stage_ms(to)) / now_ms > needed) ++agreeing;
  }
  return agreeing;
}

LayerCosts median_layer_costs(const std::vector<LayerCosts>& steps) {
  PIPIT_CHECK(!steps.empty(), "median_layer_costs: no steps given");
  LayerCosts medians;
  for (auto field : {&LayerCosts::ms, &LayerCosts::output_bytes, &LayerCosts::state_bytes}) {
    const size_t layers = (steps.front().*field).size();
    for (size_t l = 0; l < layers; ++l) {
      std::vector<double> samples;
      for (const LayerCosts& step : steps) {
        PIPIT_CHECK((step.*field).size() == layers, "median_layer_costs: steps measured ", layers,
                    " and ", (step.*field).size(), " layers");
        samples.push_back((step.*field)[l]);
      }
      (medians.*field).push_back(median(std::move(samples)));
    }
  }
  std::vector<double> loss_samples;
  for (const LayerCosts& step : steps) loss_samples.push_back(step.loss_ms);
  medians.loss_ms = median(std::move(loss_samples));
  return medians;
}

}  // namespace pipit
