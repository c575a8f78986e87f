#pragma once
// A node of the autograd graph: given dL/d(output) it returns dL/d(input) for each input.
// next[i] is the node that receives input i's gradient (null when input i needs none).
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace pipit {

class Node {
 public:
  virtual ~Node() = default;
  // One entry per input; an undefined tensor means "no gradient".
  virtual std::vector<Tensor> apply(const Tensor& grad_output) = 0;
  virtual std::string name() const = 0;

  std::vector<std::shared_ptr<Node>> next;
};

// The node behind a leaf that requires grad: adds incoming gradients into the leaf's grad().
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<AutogradMeta> meta) : meta_(std::move(meta)) {}
  std::vector<Tensor> apply(const Tensor& grad_output) override;
  std::string name() const override { return "AccumulateGrad"; }

 private:
  std::shared_ptr<AutogradMeta> meta_;
};

}  // namespace pipit
