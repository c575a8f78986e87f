#include "optim/optimizer.h"

#include <set>

#include "autograd/grad_mode.h"
#include "optim/optimizer_state.h"
#include "tensor/backend.h"

namespace pipit {

void Optimizer::zero_grad() {
  for (auto& [name, p] : parameters_) p.zero_grad();
}

StateDict optimizer_state_for(const StateDict& state, const NamedParameters& parameters) {
  std::set<std::string> names;
  for (const auto& [name, p] : parameters) names.insert(name);
  StateDict own;
  // Entries are "<param>.<buffer>", and buffer names have no dot.
  for (const auto& [key, value] : state) {
    const size_t dot = key.rfind('.');
    if (key == "step" || (dot != std::string::npos && names.count(key.substr(0, dot)))) {
      own[key] = value;
    }
  }
  return own;
}

namespace detail {

// The gradient as a contiguous tensor the update kernels can walk linearly.
Tensor contiguous_grad(const std::string& name, const Tensor& param) {
  Tensor g = param.grad();
  PIPIT_CHECK(g.shape() == param.shape(), "optimizer: gradient of '", name, "' has shape ",
              shape_str(g.shape()), " but the parameter has ", shape_str(param.shape()));
  PIPIT_CHECK(param.is_contiguous(), "optimizer: parameter '", name, "' is not contiguous");
  if (g.is_contiguous()) return g;
  Tensor copy = Tensor::empty(g.shape(), g.dtype(), g.device());
  backend(g).copy(g, copy);
  return copy;
}

// Copies a saved state tensor into place, checking its name and shape.
void load_state_tensor(const StateDict& state, const std::string& key, const Tensor& into) {
  auto it = state.find(key);
  PIPIT_CHECK(it != state.end(), "optimizer load_state_dict: missing '", key, "'");
  PIPIT_CHECK(it->second.shape() == into.shape() && it->second.dtype() == into.dtype(),
              "optimizer load_state_dict: '", key, "' has shape ", shape_str(it->second.shape()),
              " ", it->second.dtype(), ", expected ", shape_str(into.shape()), " ", into.dtype());
  backend(into).copy(it->second, into);
}

Tensor clone_tensor(const Tensor& t) {
  Tensor copy = Tensor::empty(t.shape(), t.dtype(), t.device());
  backend(t).copy(t, copy);
  return copy;
}

int64_t load_step(const StateDict& state) {
  auto it = state.find("step");
  PIPIT_CHECK(it != state.end(), "optimizer load_state_dict: missing 'step'");
  return it->second.item<int64_t>();
}

}  // namespace detail
}  // namespace pipit
