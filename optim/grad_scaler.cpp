#include "optim/grad_scaler.h"

#include <cmath>

#include "autograd/elementwise.h"
#include "autograd/grad_mode.h"

namespace pipit {

namespace {

void check_options(const GradScalerOptions& options) {
  PIPIT_CHECK(std::isfinite(options.init_scale) && options.init_scale > 0 &&
                  std::isfinite(options.growth_factor) && options.growth_factor > 1 &&
                  options.backoff_factor > 0 && options.backoff_factor < 1 &&
                  options.growth_interval >= 1,
              "GradScaler: need init_scale > 0, growth_factor > 1, backoff_factor in (0, 1) and "
              "growth_interval >= 1");
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options) : options_(options), scale_(options.init_scale) {
  check_options(options);
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

nlohmann::json GradScaler::state_dict() const {
  return {{"scale", scale_},
          {"growth_tracker", clean_steps_},
          {"growth_factor", options_.growth_factor},
          {"backoff_factor", options_.backoff_factor},
          {"growth_interval", options_.growth_interval}};
}

void GradScaler::load_state_dict(const nlohmann::json& state) {
  PIPIT_CHECK(state.is_object(), "GradScaler state: expected an object, got ", state.dump());
  auto number = [&](const char* key) {
    PIPIT_CHECK(state.contains(key) && state[key].is_number(), "GradScaler state: '", key,
                "' must be a number, got ", state.contains(key) ? state[key].dump() : "nothing");
    return state[key].get<double>();
  };
  auto integer = [&](const char* key) {
    PIPIT_CHECK(state.contains(key) && state[key].is_number_integer(), "GradScaler state: '", key,
                "' must be an integer, got ", state.contains(key) ? state[key].dump() : "nothing");
    return state[key].get<int64_t>();
  };
  GradScalerOptions options{number("scale"), number("growth_factor"), number("backoff_factor"),
                            integer("growth_interval")};
  check_options(options);
  const int64_t clean_steps = integer("growth_tracker");
  PIPIT_CHECK(clean_steps >= 0 && clean_steps < options.growth_interval,
              "GradScaler state: 'growth_tracker' must be in [0, growth_interval), got ",
              clean_steps);
  options_ = options;
  scale_ = options.init_scale;
  clean_steps_ = clean_steps;
  found_inf_ = false;
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
