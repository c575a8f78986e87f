#pragma once
// Split backward, for zero-bubble pipeline schedules (Qi et al., ICLR 2024): the part of
// output.backward(grad) that leads to some inputs runs now (B, which the previous stage is
// waiting for); the rest, which leads only to other leaves such as parameters (W, which nobody
// waits for), is kept and run later. Nodes compute only the gradients of the edges they are
// given (Linear and matmul: grad_input in B, grad_weight in W), so nothing is computed twice.
//
// B then W accumulates exactly what backward(grad) does, bit for bit, for every leaf that
// receives at most two gradients within the graph (sums of three or more may add in another
// order).
#include <memory>
#include <vector>

#include "tensor/tensor.h"

namespace pipit {

class Node;

class DeferredGradients {
 public:
  DeferredGradients() = default;
  DeferredGradients(DeferredGradients&&) noexcept = default;
  DeferredGradients& operator=(DeferredGradients&&) noexcept = default;
  ~DeferredGradients();

  // Runs the deferred part, accumulating into the leaves' grad(); afterwards empty().
  void run();
  bool empty() const { return work_.empty(); }

  // A node reached by B with edges left for W, and the gradient it received.
  struct Work {
    std::shared_ptr<Node> node;
    Tensor grad;
  };

 private:
  friend DeferredGradients backward_inputs_first(const Tensor&, const Tensor&,
                                                 const std::vector<Tensor>&);
  std::vector<Work> work_;
};

// Runs the part of output.backward(grad) that reaches `inputs` and returns the rest. A leaf
// input's grad() is set as backward would set it; an input computed inside the graph (a first
// layer's output, when the model's input needs no gradient) gets its gradient, but the work of
// the node that computed it is deferred. The graph can be dropped afterwards: the returned
// work keeps only the nodes, saved tensors and gradients W needs. With no input that requires
// grad, everything is deferred.
DeferredGradients backward_inputs_first(const Tensor& output, const Tensor& grad,
                                        const std::vector<Tensor>& inputs);

}  // namespace pipit
