#include "pipeline/rebalancing/cost_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "tensor/error.h"

namespace pipit {

namespace {

constexpr double kBytesPerMb = 1e6;

std::vector<size_t> chunk_of_each_layer(const std::vector<LayerRange>& ranges, size_t layers) {
  std::vector<size_t> chunk_of(layers);
  for (size_t c = 0; c < ranges.size(); ++c) {
    for (size_t l = ranges[c].begin; l < ranges[c].end; ++l) chunk_of[l] = c;
  }
  return chunk_of;
}

void check_link(const char* caller, double link_ms_per_mb) {
  PIPIT_CHECK(std::isfinite(link_ms_per_mb) && link_ms_per_mb >= 0, caller,
              ": link_ms_per_mb must be finite and >= 0, got ", link_ms_per_mb);
}

// Stages linked by a kind measured on both, directly or through other stages, get the same
// label: only within such a group can speeds be compared.
std::vector<size_t> stage_groups(const std::vector<std::vector<double>>& count_by_kind_stage,
                                 size_t stages) {
  std::vector<size_t> group(stages);
  for (size_t s = 0; s < stages; ++s) group[s] = s;
  for (const std::vector<double>& by_stage : count_by_kind_stage) {
    const auto first =
        std::find_if(by_stage.begin(), by_stage.end(), [](double n) { return n > 0; });
    if (first == by_stage.end()) continue;
    const size_t keep = group[static_cast<size_t>(first - by_stage.begin())];
    for (size_t s = 0; s < stages; ++s) {
      if (by_stage[s] == 0 || group[s] == keep) continue;
      const size_t merged = group[s];
      for (size_t& g : group) {
        if (g == merged) g = keep;
      }
    }
  }
  return group;
}

// Gaussian elimination; `a` (row-major, n x n) is positive definite, so no pivoting is needed.
std::vector<double> solve_positive_definite(std::vector<double> a, std::vector<double> b) {
  const size_t n = b.size();
  for (size_t col = 0; col < n; ++col) {
    for (size_t row = col + 1; row < n; ++row) {
      const double factor = a[row * n + col] / a[col * n + col];
      for (size_t k = col; k < n; ++k) a[row * n + k] -= factor * a[col * n + k];
      b[row] -= factor * b[col];
    }
  }
  std::vector<double> x(n);
  for (size_t row = n; row-- > 0;) {
    double rest = b[row];
    for (size_t k = row + 1; k < n; ++k) rest -= a[row * n + k] * x[k];
    x[row] = rest / a[row * n + row];
  }
  return x;
}

}  // namespace

void check_partition(const char* caller, const std::vector<LayerRange>& ranges, size_t layers,
                     size_t chunks) {
  PIPIT_CHECK(ranges.size() == chunks, caller, ": ", ranges.size(), " ranges given for ", chunks,
              " chunks (stages x chunks per stage)");
  size_t covered = 0;
  for (size_t c = 0; c < ranges.size(); ++c) {
    PIPIT_CHECK(ranges[c].begin == covered, caller, ": chunk ", c, " starts at layer ",
                ranges[c].begin, " instead of ", covered,
                "; ranges must be contiguous, in model order, from layer 0: ", ranges_str(ranges));
    PIPIT_CHECK(ranges[c].end > ranges[c].begin, caller, ": chunk ", c, " [", ranges[c].begin, ", ",
                ranges[c].end, ") is empty; every chunk needs at least 1 layer");
    covered = ranges[c].end;
  }
  PIPIT_CHECK(covered == layers, caller, ": the ranges cover layers [0, ", covered,
              "), but the model has ", layers, " layers: ", ranges_str(ranges));
}

void check_layer_values(const char* caller, const char* what, const std::vector<double>& values,
                        size_t layers) {
  PIPIT_CHECK(values.size() == layers, caller, ": ", what, " has ", values.size(), " entries for ",
              layers, " layers");
  for (size_t l = 0; l < values.size(); ++l) {
    PIPIT_CHECK(std::isfinite(values[l]) && values[l] >= 0, caller, ": ", what, "[", l,
                "] = ", values[l], "; it must be finite and >= 0");
  }
}

void check_layer_costs(const char* caller, const LayerCosts& costs, size_t layers) {
  check_layer_values(caller, "ms", costs.ms, layers);
  check_layer_values(caller, "output_bytes", costs.output_bytes, layers);
  check_layer_values(caller, "state_bytes", costs.state_bytes, layers);
  PIPIT_CHECK(std::isfinite(costs.loss_ms) && costs.loss_ms >= 0, caller,
              ": loss_ms = ", costs.loss_ms, "; it must be finite and >= 0");
}

CostModel::CostModel(std::vector<double> layer_work, std::vector<double> stage_speed,
                     std::vector<double> output_bytes, double link_ms_per_mb, double loss_ms)
    : layer_work_(std::move(layer_work)),
      stage_speed_(std::move(stage_speed)),
      output_bytes_(std::move(output_bytes)),
      link_ms_per_mb_(link_ms_per_mb),
      loss_ms_(loss_ms) {
  const char* caller = "CostModel";
  PIPIT_CHECK(!stage_speed_.empty(), caller, ": no stage speeds given; a model needs 1 stage");
  for (size_t s = 0; s < stage_speed_.size(); ++s) {
    PIPIT_CHECK(std::isfinite(stage_speed_[s]) && stage_speed_[s] > 0, caller, ": stage_speed[", s,
                "] = ", stage_speed_[s], "; it must be finite and > 0");
  }
  check_layer_values(caller, "layer_work", layer_work_, layer_work_.size());
  check_layer_values(caller, "output_bytes", output_bytes_, layer_work_.size());
  check_link(caller, link_ms_per_mb_);
  PIPIT_CHECK(std::isfinite(loss_ms_) && loss_ms_ >= 0, caller, ": loss_ms = ", loss_ms_,
              "; it must be finite and >= 0");
  work_before_.assign(layer_work_.size() + 1, 0.0);
  for (size_t l = 0; l < layer_work_.size(); ++l) {
    work_before_[l + 1] = work_before_[l] + layer_work_[l];
  }
}

namespace {

// Over the layers with a positive time: how many, and their sum of log ms, per kind, per
// stage and per (kind, stage).
struct LogTimes {
  std::vector<double> kind_count, kind_log_sum, stage_count, stage_log_sum;
  std::vector<std::vector<double>> count_by_kind_stage;
};

LogTimes log_times(const LayerCosts& measured, const std::vector<size_t>& kind_of,
                   const std::vector<size_t>& chunk_of, size_t kinds, size_t p) {
  LogTimes t{std::vector<double>(kinds), std::vector<double>(kinds), std::vector<double>(p),
             std::vector<double>(p),
             std::vector<std::vector<double>>(kinds, std::vector<double>(p))};
  for (size_t l = 0; l < kind_of.size(); ++l) {
    if (measured.ms[l] == 0) continue;
    const double log_ms = std::log(measured.ms[l]);
    const size_t k = kind_of[l], s = chunk_of[l] % p;
    t.kind_count[k] += 1;
    t.kind_log_sum[k] += log_ms;
    t.stage_count[s] += 1;
    t.stage_log_sum[s] += log_ms;
    t.count_by_kind_stage[k][s] += 1;
  }
  return t;
}

// Each stage's log speed b: for given b, the best log work of kind k is the mean over its
// layers of log ms - b(stage). Putting that into the least-squares problem leaves the normal
// equations L b = r, where L is the Laplacian of the graph linking stages through kinds.
std::vector<double> fit_log_speeds(const LogTimes& t, size_t p) {
  std::vector<double> normal(p * p), rhs(p);
  for (size_t s = 0; s < p; ++s) {
    normal[s * p + s] = t.stage_count[s];
    rhs[s] = t.stage_log_sum[s];
  }
  for (size_t k = 0; k < t.kind_count.size(); ++k) {
    if (t.kind_count[k] == 0) continue;
    const std::vector<double>& on = t.count_by_kind_stage[k];
    for (size_t s = 0; s < p; ++s) {
      rhs[s] -= on[s] * t.kind_log_sum[k] / t.kind_count[k];
      for (size_t u = 0; u < p; ++u) normal[s * p + u] -= on[s] * on[u] / t.kind_count[k];
    }
  }
  // L is singular: raising a group's speeds by a factor and lowering its kinds' work by the
  // same factor fits equally well. Adding 1 between every two stages of a group picks the
  // solution whose log speeds sum to 0 in each group (geometric mean 1) and makes the matrix
  // positive definite; r sums to 0 over each group, so L b = r still holds.
  const std::vector<size_t> group = stage_groups(t.count_by_kind_stage, p);
  for (size_t s = 0; s < p; ++s) {
    for (size_t u = 0; u < p; ++u) {
      if (group[s] == group[u]) normal[s * p + u] += 1;
    }
  }
  // Solved directly rather than by alternating the two averages, which converges to the same
  // answer but slowly when a stage shares few layers with the others: noise-free
  // measurements give back the planted values to rounding.
  return solve_positive_definite(std::move(normal), std::move(rhs));
}

}  // namespace

CostModel CostModel::fit(const std::vector<std::string>& layer_kinds,
                         const std::vector<LayerRange>& ranges, int stages,
                         const LayerCosts& measured, double link_ms_per_mb) {
  const char* caller = "CostModel::fit";
  const size_t layers = layer_kinds.size();
  PIPIT_CHECK(stages >= 1 && ranges.size() % static_cast<size_t>(stages) == 0, caller, ": ",
              ranges.size(), " ranges do not make whole chunks for ", stages, " stages");
  check_partition(caller, ranges, layers, ranges.size());
  check_layer_costs(caller, measured, layers);

  std::map<std::string, size_t> kind_index;
  std::vector<size_t> kind_of(layers);
  for (size_t l = 0; l < layers; ++l) {
    kind_of[l] = kind_index.emplace(layer_kinds[l], kind_index.size()).first->second;
  }
  const size_t kinds = kind_index.size(), p = static_cast<size_t>(stages);
  const LogTimes t = log_times(measured, kind_of, chunk_of_each_layer(ranges, layers), kinds, p);
  const std::vector<double> log_speed = fit_log_speeds(t, p);
  std::vector<double> kind_work(kinds, 0.0);
  for (size_t k = 0; k < kinds; ++k) {
    if (t.kind_count[k] == 0) continue;
    double log_work_sum = t.kind_log_sum[k];
    for (size_t s = 0; s < p; ++s) log_work_sum -= t.count_by_kind_stage[k][s] * log_speed[s];
    kind_work[k] = std::exp(log_work_sum / t.kind_count[k]);
  }
  std::vector<double> layer_work(layers), stage_speed(p);
  for (size_t l = 0; l < layers; ++l) layer_work[l] = kind_work[kind_of[l]];
  for (size_t s = 0; s < p; ++s) stage_speed[s] = std::exp(log_speed[s]);
  return CostModel(std::move(layer_work), std::move(stage_speed), measured.output_bytes,
                   link_ms_per_mb, measured.loss_ms);
}

double CostModel::chunk_ms(int stage, LayerRange range) const {
  PIPIT_CHECK(stage >= 0 && stage < stages(), "CostModel::chunk_ms: stage ", stage,
              " is not in [0, ", stages(), ")");
  PIPIT_CHECK(range.begin < range.end && range.end <= layers(), "CostModel::chunk_ms: [",
              range.begin, ", ", range.end, ") is not a non-empty range of the model's ", layers(),
              " layers");
  const bool last = range.end == layers();
  const double compute_ms = stage_speed_[static_cast<size_t>(stage)] *
                                (work_before_[range.end] - work_before_[range.begin]) +
                            (last ? loss_ms_ : 0);
  if (stages() == 1) return compute_ms;
  double sent_bytes = 0;
  if (!last) sent_bytes += output_bytes_[range.end - 1];
  if (range.begin > 0) sent_bytes += output_bytes_[range.begin - 1];
  return compute_ms + sent_bytes / kBytesPerMb * link_ms_per_mb_;
}

std::vector<double> CostModel::stage_ms(const std::vector<LayerRange>& ranges) const {
  const auto p = static_cast<size_t>(stages());
  PIPIT_CHECK(ranges.size() % p == 0, "CostModel::stage_ms: ", ranges.size(),
              " ranges do not make whole chunks for ", p, " stages");
  check_partition("CostModel::stage_ms", ranges, layers(), ranges.size());
  std::vector<double> ms(p, 0.0);
  for (size_t c = 0; c < ranges.size(); ++c) {
    ms[c % p] += chunk_ms(static_cast<int>(c % p), ranges[c]);
  }
  return ms;
}

double CostModel::slowest_stage_ms(const std::vector<LayerRange>& ranges) const {
  const std::vector<double> ms = stage_ms(ranges);
  return *std::max_element(ms.begin(), ms.end());
}

double predict_step_ms(const CostModel& model, const std::vector<LayerRange>& ranges,
                       int microbatches) {
  PIPIT_CHECK(microbatches >= 1, "predict_step_ms: microbatches must be >= 1, got ", microbatches);
  const double slowest = model.slowest_stage_ms(ranges);
  const double chunks_per_stage = static_cast<double>(ranges.size()) / model.stages();
  return (microbatches + (model.stages() - 1) / chunks_per_stage) * slowest;
}

Migration estimate_migration(const std::vector<LayerRange>& from, const std::vector<LayerRange>& to,
                             int stages, const std::vector<double>& state_bytes,
                             double link_ms_per_mb) {
  const char* caller = "estimate_migration";
  const size_t layers = state_bytes.size();
  PIPIT_CHECK(stages >= 1 && from.size() % static_cast<size_t>(stages) == 0, caller, ": ",
              from.size(), " ranges do not make whole chunks for ", stages, " stages");
  check_partition(caller, from, layers, from.size());
  check_partition(caller, to, layers, from.size());
  check_layer_values(caller, "state_bytes", state_bytes, layers);
  check_link(caller, link_ms_per_mb);

  const std::vector<size_t> chunk_before = chunk_of_each_layer(from, layers);
  const std::vector<size_t> chunk_after = chunk_of_each_layer(to, layers);
  const auto p = static_cast<size_t>(stages);
  Migration migration;
  for (size_t l = 0; l < layers; ++l) {
    if (chunk_before[l] % p != chunk_after[l] % p) migration.bytes += state_bytes[l];
    if (p > 1) {
      const size_t hops =
          std::max(chunk_before[l], chunk_after[l]) - std::min(chunk_before[l], chunk_after[l]);
      migration.link_bytes += static_cast<double>(hops) * state_bytes[l];
    }
  }
  migration.ms = migration.link_bytes / kBytesPerMb * link_ms_per_mb;
  return migration;
}

}  // namespace pipit
