#include "autograd/grad_mode.h"
#include "optim/optimizer.h"
#include "optim/optimizer_state.h"
#include "tensor/backend.h"
#include "tensor/factory.h"

namespace pipit {

SGD::SGD(NamedParameters parameters, SGDOptions options)
    : Optimizer(std::move(parameters)), options_(options) {
  PIPIT_CHECK(options.lr >= 0 && options.momentum >= 0 && options.weight_decay >= 0,
              "SGD: lr, momentum and weight_decay must be >= 0");
}

void SGD::step() {
  NoGradGuard no_grad;
  ++step_;
  for (auto& [name, p] : parameters_) {
    if (!p.grad().defined()) continue;
    Tensor g = detail::contiguous_grad(name, p);
    Tensor buffer;
    bool first = false;
    if (options_.momentum > 0) {
      auto it = momentum_.find(name);
      first = it == momentum_.end();
      if (first) it = momentum_.emplace(name, zeros_like(p)).first;
      buffer = it->second;
    }
    backend(p).sgd_step(p, g, buffer, options_.lr, options_.momentum, options_.weight_decay, first);
  }
}

StateDict SGD::state_dict() const {
  StateDict state;
  for (const auto& [name, buffer] : momentum_) state[name + ".momentum_buffer"] = buffer;
  state["step"] = from_vector<int64_t>({step_}, {});
  return state;
}

void SGD::load_state_dict(const StateDict& state) {
  StateDict loaded;
  size_t used = 1;
  for (const auto& [name, p] : parameters_) {
    const std::string key = name + ".momentum_buffer";
    if (!state.count(key)) continue;
    Tensor buffer = zeros_like(p);
    detail::load_state_tensor(state, key, buffer);
    loaded[name] = buffer;
    ++used;
  }
  step_ = detail::load_step(state);
  PIPIT_CHECK(used == state.size(), "SGD load_state_dict: ", state.size() - used,
              " entries name no parameter of this optimizer");
  momentum_ = std::move(loaded);
}

nlohmann::json SGD::config() const {
  return {{"type", "SGD"},
          {"lr", options_.lr},
          {"momentum", options_.momentum},
          {"weight_decay", options_.weight_decay}};
}

}  // namespace pipit
