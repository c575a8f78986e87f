#include "optim/grad_scaler.h"

#include <cmath>

#include "autograd/elementwise.h"
#include "autograd/grad_mode.h"

namespace pipit {

GradScaler::GradScaler(GradScalerOptions options) : options_(options), scale_(options.init_scale) {
  PIPIT_CHECK(options.init_scale > 0 && options.growth_factor > 1 && options.backoff_factor > 0 &&
                  options.backoff_factor < 1 && options.growth_interval >= 1,
              "GradScaler: need init_scale > 0, growth_factor > 1, backoff_factor in (0, 1) and "
              "growth_interval >= 1");
}

Tensor GradScaler::scale(const Tensor& loss) const {
  return loss * scale_;
}

bool GradScaler::step(Optimizer& optimizer) {
  std::vector<Tensor> parameters;
  for (const auto& [name, p] : optimizer.parameters()) parameters.push_back(p);
  found_inf_ = !std::isfinite(grad_norm_squared(parameters));
  if (found_inf_) return false;
  scale_gradients(parameters, 1.0 / scale_);
  optimizer.step();
  return true;
}

void GradScaler::update() {
  update(found_inf_);
}

void GradScaler::update(bool found_inf) {
  if (found_inf) {
    scale_ *= options_.backoff_factor;
    clean_steps_ = 0;
    return;
  }
  if (++clean_steps_ == options_.growth_interval) {
    scale_ *= options_.growth_factor;
    clean_steps_ = 0;
  }
}

}  // namespace pipit
