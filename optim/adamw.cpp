#include <algorithm>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "autograd/grad_mode.h"
#include "optim/optimizer.h"
#include "optim/optimizer_state.h"
#include "tensor/backend.h"
#include "tensor/factory.h"

namespace pipit {

AdamW::AdamW(NamedParameters parameters, AdamWOptions options)
    : Optimizer(std::move(parameters)), options_(options) {
  PIPIT_CHECK(options.lr >= 0 && options.eps >= 0 && options.weight_decay >= 0,
              "AdamW: lr, eps and weight_decay must be >= 0");
  PIPIT_CHECK(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1,
              "AdamW: betas must be in [0, 1), got ", options.beta1, " and ", options.beta2);
}

void AdamW::step() {
  NoGradGuard no_grad;
  ++step_;
  // One fused update per (device, dtype, weight decay) group rather than one per parameter.
  std::map<std::tuple<std::string, DType, double>, std::vector<AdamWSlot>> groups;
  for (auto& [name, p] : parameters_) {
    if (!p.grad().defined()) continue;
    Tensor g = detail::contiguous_grad(name, p);
    auto m = exp_avg_.find(name);
    if (m == exp_avg_.end()) {
      m = exp_avg_.emplace(name, zeros_like(p)).first;
      exp_avg_sq_.emplace(name, zeros_like(p));
    }
    const double decay = std::ranges::count(options_.no_decay, name) ? 0 : options_.weight_decay;
    groups[{p.device().str(), p.dtype(), decay}].push_back({p, g, m->second, exp_avg_sq_.at(name)});
  }
  for (const auto& [key, slots] : groups) {
    backend(slots[0].param)
        .adamw_step(slots, {options_.lr, options_.beta1, options_.beta2, options_.eps,
                            std::get<2>(key), step_});
  }
}

StateDict AdamW::state_dict() const {
  StateDict state;
  for (const auto& [name, m] : exp_avg_) {
    state[name + ".exp_avg"] = m;
    state[name + ".exp_avg_sq"] = exp_avg_sq_.at(name);
  }
  state["step"] = from_vector<int64_t>({step_}, {});
  return state;
}

void AdamW::load_state_dict(const StateDict& state) {
  StateDict m, v;
  size_t used = 1;
  for (const auto& [name, p] : parameters_) {
    if (!state.count(name + ".exp_avg")) continue;
    m[name] = zeros_like(p);
    v[name] = zeros_like(p);
    detail::load_state_tensor(state, name + ".exp_avg", m[name]);
    detail::load_state_tensor(state, name + ".exp_avg_sq", v[name]);
    used += 2;
  }
  step_ = detail::load_step(state);
  PIPIT_CHECK(used == state.size(), "AdamW load_state_dict: ", state.size() - used,
              " entries name no parameter of this optimizer");
  exp_avg_ = std::move(m);
  exp_avg_sq_ = std::move(v);
}

nlohmann::json AdamW::config() const {
  nlohmann::json config = {{"type", "AdamW"},         {"lr", options_.lr},
                           {"beta1", options_.beta1}, {"beta2", options_.beta2},
                           {"eps", options_.eps},     {"weight_decay", options_.weight_decay}};
  config["no_decay"] = options_.no_decay;
  return config;
}

}  // namespace pipit
