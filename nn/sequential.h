#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nn/module.h"

namespace pipit {

// Layers applied in order, each one tensor in and one tensor out, so a pipeline can cut the
// model between any two layers. Children are named by their index in the full model ("0",
// "1", ...); a slice keeps those names, so a stage's state_dict() keys match the full model's.
class Sequential final : public Module {
 public:
  Sequential() = default;
  explicit Sequential(std::vector<std::shared_ptr<Module>> layers, size_t first_index = 0);

  Tensor forward(const Tensor& x) override;
  // {"type": "Sequential", "first_index": i, "layers": [child configs]}, plus
  // "ties": [[parameter, tied_to], ...] when parameters are tied.
  json config() const override;

  // Ties `parameter` to `tied_to` (both full-model names, "13.weight" and "0.tokens.weight")
  // through Module::tie_parameter, and records the tie in config() so a rebuilt model has it.
  void tie(const std::string& parameter, const std::string& tied_to);
  // Each tie as {parameter, tied_to}.
  const std::vector<std::pair<std::string, std::string>>& ties() const { return ties_; }

  void push_back(std::shared_ptr<Module> layer);
  size_t size() const { return layers_.size(); }
  const std::shared_ptr<Module>& operator[](size_t i) const;
  size_t first_index() const { return first_index_; }
  // Puts `layer` in place of layer i (a pipeline's remap hands the model the modules its
  // stages now train). A layer that holds a tied parameter cannot be replaced.
  void replace(size_t i, std::shared_ptr<Module> layer);
  // Layers [begin, end) as a Sequential sharing the same modules and parameters, with the ties
  // inside the range. A range that separates tied parameters is refused.
  std::shared_ptr<Sequential> slice(size_t begin, size_t end) const;
  // Layers [begin, end) with every tie broken, as a pipeline cuts the model: a layer holding a
  // tie's parameter is rebuilt from its config with its own copy of the values; the other
  // layers are shared. (pipeline/gradients/tied_parameters.h keeps the copies equal.)
  std::shared_ptr<Sequential> untied_slice(size_t begin, size_t end) const;

 private:
  // The layer (index into layers_) a full-model parameter name belongs to.
  size_t layer_of(const std::string& name) const;

  std::vector<std::shared_ptr<Module>> layers_;
  std::vector<std::pair<std::string, std::string>> ties_;
  size_t first_index_ = 0;
};

}  // namespace pipit
