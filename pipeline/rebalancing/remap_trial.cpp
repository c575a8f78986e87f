#include "pipeline/rebalancing/remap_trial.h"

#include <algorithm>
#include <cstdio>

#include "tensor/error.h"

namespace pipit {

double median_of(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

RemapTrial::RemapTrial(std::vector<LayerRange> before, double before_ms, int64_t remapped_at,
                       int cooldown, int window, double threshold)
    : before_(std::move(before)),
      before_ms_(before_ms),
      remapped_at_(remapped_at),
      cooldown_(cooldown),
      window_(window),
      threshold_(threshold) {
  PIPIT_CHECK(window_ >= 1 && cooldown_ >= 0 && threshold_ >= 0 && before_ms_ >= 0,
              "RemapTrial: window ", window_, ", cooldown ", cooldown_, ", threshold ", threshold_,
              " and step time ", before_ms_, " must not be negative (window >= 1)");
}

std::optional<bool> RemapTrial::record(int64_t step, double step_ms) {
  if (step <= remapped_at_ + cooldown_) return std::nullopt;
  after_.push_back(step_ms);
  if (static_cast<int>(after_.size()) < window_) return std::nullopt;
  return median_of(after_) > before_ms_ * (1 + threshold_);
}

std::string RemapTrial::summary() const {
  char text[160];
  std::snprintf(text, sizeof text, "steps took %.1f ms before the remap and %.1f ms after",
                before_ms_, median_of(after_));
  return text;
}

}  // namespace pipit
