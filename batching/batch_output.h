#pragma once
// How the graph hands out a batch's output: behind a node that collects, summed in place,
// the gradients of the rows later gathers read. A batch read by many later batches (a
// Tree-LSTM's leaves by every level above) then costs one full-size gradient, not one per
// reader. The autograd engine applies the node even when no edge brought it a gradient.
#include <memory>

#include "autograd/node.h"

namespace pipit::batching {

struct BatchOutputBackward : Node {
  Tensor rows_gradient;  // what gathers added; undefined until one does
  std::vector<Tensor> apply(const Tensor& grad_output) override;
  bool runs_without_gradient() const override { return true; }
  std::string name() const override { return "BatchOutputBackward"; }
  // Adds `width` floats from `grad` into row `row` of the gradient (of a tensor of `shape`).
  void add_row(const Shape& shape, int64_t row, const float* grad, int64_t width);
};

// `output` with that node in front of its own backward (itself when it needs no gradient).
Tensor expose_batch_output(const Tensor& output);

// The node behind a tensor expose_batch_output made; null for any other tensor.
std::shared_ptr<BatchOutputBackward> batch_output_node(const Tensor& t);

}  // namespace pipit::batching
