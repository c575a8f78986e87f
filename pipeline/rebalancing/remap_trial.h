#pragma once
// RemapTrial: whether an automatic remap paid off, judged on measured step times rather than
// on the cost model that proposed it. The model can be wrong (stages that share fewer cores
// than there are stages wait for cores, which it does not know): a remap whose steps turn
// out slower than before is undone, and rebalancing stops for the run.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pipeline/partition.h"

namespace pipit {

class RemapTrial {
 public:
  // `before`: the partition the remap left; `before_ms`: the median step time there.
  // After `cooldown` steps, `window` step times are compared with it.
  RemapTrial(std::vector<LayerRange> before, double before_ms, int64_t remapped_at, int cooldown,
             int window, double threshold);

  // Records the time of training step `step`. Returns the verdict once there is one: true
  // when the remap made steps slower by more than `threshold` (undo it).
  std::optional<bool> record(int64_t step, double step_ms);

  const std::vector<LayerRange>& before() const { return before_; }
  // "steps took 41.2 ms before the remap and 55.0 ms after"
  std::string summary() const;

 private:
  std::vector<LayerRange> before_;
  double before_ms_;
  int64_t remapped_at_;
  int cooldown_, window_;
  double threshold_;
  std::vector<double> after_;
};

// The median of `values` (the upper one of an even count); 0 for none.
double median_of(std::vector<double> values);

}  // namespace pipit
