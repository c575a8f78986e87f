#pragma once
// Automatic rebalancing: when and where to move layers between pipeline stages. Pure code:
// the caller measures every layer each step, hands the measurements to observe(), applies a
// Decision with Coordinator::remap and reports the remap with remapped().
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "pipeline/partition.h"
#include "pipeline/rebalancing/cost_model.h"

namespace pipit {

struct RebalanceConfig {
  bool enabled = false;
  int window = 8;               // steps whose per-layer medians are judged together
  double threshold = 0.10;      // propose only if the predicted slowest stage gains more
  int cooldown = 10;            // steps after a remap that are not measured
  int payback_steps = 50;       // the migration must pay for itself within this many steps
  double link_ms_per_mb = 1.0;  // ms to send 1 MB (1e6 bytes) to a neighbouring stage
};

// The contiguous partition, one chunk of >= 1 layer per stage, whose slowest stage is the
// fastest under `model`: exact, by dynamic programming over layers and stages, O(p n^2) chunk
// costs. Partitions within 1e-9 (relative) of the fastest count as equally fast; among them
// it takes the one whose migration from `current` sends the fewest bytes over links
// (estimate_migration's link_bytes), then each cut as early as possible.
std::vector<LayerRange> optimal_partition(const CostModel& model,
                                          const std::vector<LayerRange>& current,
                                          const std::vector<double>& state_bytes);

// Per layer, the median over `steps` of each measurement; and the median loss_ms.
LayerCosts median_layer_costs(const std::vector<LayerCosts>& steps);

struct Decision {
  std::vector<LayerRange> from, to;
  double current_slowest_ms = 0, new_slowest_ms = 0;  // predicted, per microbatch
  double gain = 0;                                    // (current - new) / current
  Migration migration;
  double payback_steps = 0;         // migration.ms over the step time it saves
  std::vector<double> stage_speed;  // the fitted speeds the prediction rests on
  // One line, for logs and the trace.
  std::string reason() const;
};

// Proposes a remap when the measurements say it pays, and only:
// - on a full window of `window` steps measured at the current partition, none of them in
//   the `cooldown` steps after a remap (report every remap, automatic or manual, with
//   remapped(); a partition that changes unreported restarts the window, without cooldown);
// - when the optimal partition under the CostModel fitted to the window's per-layer medians
//   makes the predicted slowest stage faster by more than `threshold`, or by more than twice
//   `threshold` if it is the partition left at the last remap: undoing a remap must pay
//   clearly (it happens when a remap moved layers onto a stage whose speed could not be
//   fitted, see CostModel::fit), so noise cannot swing the partition back and forth;
// - when that gain also shows in the CostModel fitted to each step of the window alone, in
//   at least window - window / 8 of them (7 of 8): a median of a few noisy steps can land on
//   the wrong side of the threshold by chance, most steps together rarely do, and one
//   outlier step in eight is tolerated;
// - when the migration's ms are repaid by the step time saved within `payback_steps`.
// After a proposal the window restarts, so one the caller declines returns at most once per
// window. Supports v = 1 chunk per stage when enabled: with v > 1 a stage's time sums chunks
// spread along the model, which optimal_partition does not solve (manual remaps work with
// any v).
class RebalancePolicy {
 public:
  RebalancePolicy(RebalanceConfig config, int stages, int chunks_per_stage,
                  std::vector<std::string> layer_kinds);

  // `step_costs` were measured in `step` (increasing from call to call) with the layers in
  // `current`, over `microbatches` microbatches. Disabled, it returns nothing and checks
  // nothing.
  std::optional<Decision> observe(int64_t step, const std::vector<LayerRange>& current,
                                  const LayerCosts& step_costs, int microbatches);
  // The partition has been `now` since the end of `step`.
  void remapped(int64_t step, std::vector<LayerRange> now);
  // Why the last observe() returned what it did, in one line.
  const std::string& verdict() const { return verdict_; }

 private:
  std::optional<Decision> judge(const std::vector<LayerRange>& current, int microbatches);
  // How many of the window's steps, each fitted alone, predict `to` faster than `current`
  // by more than `needed`.
  size_t steps_showing_gain(const std::vector<LayerRange>& current,
                            const std::vector<LayerRange>& to, double needed) const;

  RebalanceConfig config_;
  int stages_;
  int chunks_per_stage_;
  std::vector<std::string> layer_kinds_;
  std::deque<LayerCosts> window_;
  std::vector<LayerRange> window_partition_;  // where every sample in window_ was measured
  std::vector<LayerRange> last_observed_;
  std::vector<LayerRange> left_at_last_remap_;
  std::optional<int64_t> last_step_, last_remap_step_;
  std::string verdict_ = "nothing observed yet";
};

}  // namespace pipit
