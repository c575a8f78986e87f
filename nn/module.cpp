#include "nn/module.h"

#include <set>

#include "autograd/grad_mode.h"
#include "tensor/backend.h"

namespace pipit {
namespace {

thread_local bool skipping_init = false;

}  // namespace

SkipInitGuard::SkipInitGuard() : previous_(skipping_init) {
  skipping_init = true;
}

SkipInitGuard::~SkipInitGuard() {
  skipping_init = previous_;
}

bool skip_init() {
  return skipping_init;
}

Tensor& Module::register_parameter(const std::string& name, Tensor value) {
  for (const auto& [existing, p] : parameters_) {
    PIPIT_CHECK(existing != name, "register_parameter: '", name, "' is already registered");
  }
  value.requires_grad_(true);
  parameters_.emplace_back(name, std::move(value));
  return parameters_.back().second;
}

void Module::register_child(const std::string& name, std::shared_ptr<Module> module) {
  PIPIT_CHECK(module != nullptr, "register_module: '", name, "' is null");
  for (const auto& [existing, m] : children_) {
    PIPIT_CHECK(existing != name, "register_module: '", name, "' is already registered");
  }
  children_.emplace_back(name, std::move(module));
}

void Module::replace_child(const std::string& name, std::shared_ptr<Module> module) {
  PIPIT_CHECK(module != nullptr, "replace_child: '", name, "' is null");
  for (auto& [existing, m] : children_) {
    if (existing == name) {
      m = std::move(module);
      return;
    }
  }
  throw Error("replace_child: no child is registered as '" + name + "'");
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::set<const TensorImpl*> seen;
  auto add = [&](std::string name, const Tensor& p) {
    if (seen.insert(&p.impl()).second) out.emplace_back(std::move(name), p);
  };
  for (const auto& [name, p] : parameters_) add(name, p);
  for (const auto& [child_name, child] : children_) {
    for (auto& [name, p] : child->named_parameters()) add(child_name + "." + name, p);
  }
  return out;
}

void Module::tie_parameter(const std::string& name, const Tensor& source) {
  const size_t dot = name.find('.');
  if (dot != std::string::npos) {
    const std::string child_name = name.substr(0, dot);
    for (const auto& [existing, child] : children_) {
      if (existing == child_name) return child->tie_parameter(name.substr(dot + 1), source);
    }
    throw Error("tie_parameter: no child module '" + child_name + "' (in '" + name + "')");
  }
  for (auto& [existing, p] : parameters_) {
    if (existing != name) continue;
    PIPIT_CHECK(source.defined() && source.shape() == p.shape() && source.dtype() == p.dtype() &&
                    source.device() == p.device(),
                "tie_parameter: '", name, "' is ", p.dtype(), " ", shape_str(p.shape()),
                " but the tensor tied to it is ",
                source.defined() ? shape_str(source.shape()) : std::string("undefined"));
    parameter_tied(name, source);  // first: a layer that cannot tie throws with nothing changed
    p = source;
    return;
  }
  throw Error("tie_parameter: no parameter '" + name + "'");
}

void Module::parameter_tied(const std::string& name, const Tensor&) {
  throw Error("tie_parameter: this module (" + config().value("type", std::string("?")) +
              ") cannot tie its parameter '" + name + "'");
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, p] : named_parameters()) out.push_back(p);
  return out;
}

int64_t Module::parameter_count() const {
  int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.numel();
  return n;
}

void Module::zero_grad() {
  for (Tensor& p : parameters()) p.zero_grad();
}

void Module::to(Device device) {
  for (Tensor& p : parameters()) {
    if (p.device() == device) continue;
    // The parameter's TensorImpl is shared by every handle to it, so swapping its storage in
    // place moves the module's fields, parameters_ and an optimizer's handles at once.
    const Tensor moved = p.detach().to(device);
    const Tensor grad = p.grad();
    TensorImpl& impl = p.impl();
    impl.storage = moved.storage();
    impl.strides = moved.strides();
    impl.offset = moved.offset();
    if (grad.defined()) p.set_grad(grad.to(device));
  }
}

std::vector<Generator*> Module::generators() const {
  std::vector<Generator*> all = generators_;
  for (const auto& [name, child] : children_) {
    const std::vector<Generator*> theirs = child->generators();
    all.insert(all.end(), theirs.begin(), theirs.end());
  }
  return all;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

StateDict Module::state_dict() const {
  StateDict state;
  for (auto& [name, p] : named_parameters()) state[name] = p;
  return state;
}

void Module::load_state_dict(const StateDict& state, bool strict) {
  std::set<std::string> used;
  NoGradGuard no_grad;
  auto params = named_parameters();
  for (auto& [name, p] : params) {
    auto it = state.find(name);
    if (it == state.end()) {
      PIPIT_CHECK(!strict, "load_state_dict: missing parameter '", name, "' of shape ",
                  shape_str(p.shape()));
      continue;
    }
    const Tensor& value = it->second;
    PIPIT_CHECK(value.shape() == p.shape(), "load_state_dict: parameter '", name, "' has shape ",
                shape_str(p.shape()), " but the state dict gives ", shape_str(value.shape()));
    PIPIT_CHECK(value.dtype() == p.dtype(), "load_state_dict: parameter '", name, "' has dtype ",
                p.dtype(), " but the state dict gives ", value.dtype());
    backend(p).copy(value, p);
    used.insert(name);
  }
  if (used.size() != state.size()) {
    for (const auto& [name, value] : state) {
      PIPIT_CHECK(used.count(name), "load_state_dict: unexpected parameter '", name, "' of shape ",
                  shape_str(value.shape()), " (the module has no such parameter)");
    }
  }
}

}  // namespace pipit
