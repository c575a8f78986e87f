#pragma once
// Module: the base of every layer, named as in PyTorch's C++ frontend.
// A module owns parameters and child modules, registered in order; named_parameters() walks
// them depth first with dotted names ("3.attn.qkv.weight"). config() returns the JSON the
// registry (nn/registry.h) rebuilds the module from. A parameter tied to another
// (tie_parameter) is one tensor: it is listed once, under the name met first.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tensor/generator.h"
#include "tensor/state_dict.h"
#include "tensor/tensor.h"

namespace pipit {

using json = nlohmann::json;

// While one lives on this thread, layers are built with their weights left uninitialised, for
// a loader that overwrites every one of them next (load_hf_gpt2): drawing 124M random values
// for GPT-2 small only to replace them took seconds. PyTorch's skip_init serves the same end.
class SkipInitGuard {
 public:
  SkipInitGuard();
  ~SkipInitGuard();
  SkipInitGuard(const SkipInitGuard&) = delete;
  SkipInitGuard& operator=(const SkipInitGuard&) = delete;

 private:
  bool previous_;
};
bool skip_init();

class Module {
 public:
  virtual ~Module() = default;
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }
  // {"type": "<registry name>", ...fields}; containers include their children's configs.
  virtual json config() const = 0;

  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const {
    return children_;
  }
  int64_t parameter_count() const;
  void zero_grad();
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Parameters by dotted name; the tensors share storage with the module's.
  StateDict state_dict() const;
  // Copies values in. Every name must exist with the same shape and dtype; with strict, every
  // parameter must be given. Errors name the parameter and both shapes.
  void load_state_dict(const StateDict& state, bool strict = true);
  // Makes the parameter `name` (dotted, below this module) the tensor `source`, as PyTorch's
  // `head.weight = embedding.weight`: one tensor, whose gradient sums both uses. Shapes and
  // dtypes must match; the owning layer must support it (Linear and Embedding do).
  void tie_parameter(const std::string& name, const Tensor& source);
  // Moves every parameter (and its gradient) to `device` in place: handles held elsewhere,
  // an optimizer's included, see the moved tensors.
  void to(Device device);
  // The random streams this module and its children draw from in forward (Dropout's), depth
  // first: activation recomputation rewinds them to replay a forward's draws exactly.
  std::vector<Generator*> generators() const;

 protected:
  // Marks `value` as requiring grad and returns the registered handle.
  Tensor& register_parameter(const std::string& name, Tensor value);
  // A generator forward draws from; it must live as long as the module.
  void register_generator(Generator& generator) { generators_.push_back(&generator); }
  // Called by tie_parameter after the registered tensor `name` became `value`: a layer that
  // keeps its parameters in fields too (Linear::weight) updates the field.
  virtual void parameter_tied(const std::string& name, const Tensor& value);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    register_child(name, module);
    return module;
  }

 private:
  void register_child(const std::string& name, std::shared_ptr<Module> module);

 protected:
  // Puts `module` in place of the child registered as `name`.
  void replace_child(const std::string& name, std::shared_ptr<Module> module);

 private:
  std::vector<std::pair<std::string, Tensor>> parameters_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<Generator*> generators_;
  bool training_ = true;
};

}  // namespace pipit
