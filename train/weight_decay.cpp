#include "train/weight_decay.h"

#include <algorithm>

#include "nn/conv.h"
#include "nn/layers.h"

namespace pipit {
namespace {

// Depth first: the names below `prefix` of the parameters `module` itself registered (those
// without a dot in its own named_parameters) that a matrix product does not use as weights.
void collect(const Module& module, const std::string& prefix, std::vector<std::string>& out) {
  const bool matmul = dynamic_cast<const Linear*>(&module) || dynamic_cast<const Conv2d*>(&module);
  for (const auto& [name, parameter] : module.named_parameters()) {
    const bool own = name.find('.') == std::string::npos;
    if (own && !(matmul && name == "weight")) out.push_back(prefix + name);
  }
  for (const auto& [name, child] : module.named_children()) {
    collect(*child, prefix + name + ".", out);
  }
}

}  // namespace

std::vector<std::string> no_weight_decay(const Sequential& model) {
  std::vector<std::string> names;
  collect(model, "", names);
  for (const auto& [parameter, tied_to] : model.ties()) {
    const bool spared = std::ranges::count(names, tied_to) > 0;
    std::erase(names, parameter);
    if (spared) names.push_back(parameter);
  }
  std::ranges::sort(names);
  return names;
}

}  // namespace pipit
