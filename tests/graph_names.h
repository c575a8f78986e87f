#pragma once
// What a test can see of an autograd graph: the names of its nodes.
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "tensor/tensor.h"

namespace pipit::testing {

// The names of the nodes between y and its leaves (AccumulateGrad included), each node once.
inline std::multiset<std::string> node_names(const Tensor& y) {
  std::vector<std::shared_ptr<Node>> todo{y.grad_fn()};
  std::set<const Node*> seen;
  std::multiset<std::string> names;
  while (!todo.empty()) {
    const std::shared_ptr<Node> node = todo.back();
    todo.pop_back();
    if (!node || !seen.insert(node.get()).second) continue;
    names.insert(node->name());
    for (const auto& next : node->next) todo.push_back(next);
  }
  return names;
}

}  // namespace pipit::testing
