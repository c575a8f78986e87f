#pragma once
// Internal helper for defining differentiable ops: creates the backward node of `out` and wires
// it to its inputs, or returns null when no input needs a gradient (or grad mode is off).
#include <initializer_list>
#include <memory>

#include "autograd/grad_mode.h"
#include "autograd/node.h"

namespace pipit::detail {

std::shared_ptr<Node> gradient_edge(const Tensor& input);

template <typename N>
std::shared_ptr<N> make_node(Tensor& out, std::initializer_list<Tensor> inputs) {
  if (!is_grad_enabled()) return nullptr;
  bool any = false;
  for (const Tensor& t : inputs) any = any || (t.defined() && t.requires_grad());
  if (!any) return nullptr;
  auto node = std::make_shared<N>();
  for (const Tensor& t : inputs) node->next.push_back(t.defined() ? gradient_edge(t) : nullptr);
  AutogradMeta& meta = out.autograd_meta();
  meta.requires_grad = true;
  meta.grad_fn = node;
  return node;
}

}  // namespace pipit::detail
