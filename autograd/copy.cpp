// Tensor's copies (contiguous, clone, to), declared by Tensor and defined here with the other
// differentiable ops: CopyBackward copies the gradient back to the input's dtype and device.
#include "autograd/node.h"

namespace pipit {
namespace {

struct CopyBackward : Node {
  DType input_dtype = DType::f32;
  Device input_device;
  std::vector<Tensor> apply(const Tensor& g) override {
    if (g.dtype() == input_dtype && g.device() == input_device) return {g};
    return {copy_of(g, input_dtype, input_device)};
  }
  std::string name() const override { return "CopyBackward"; }
};

}  // namespace

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = copy_of(*this, dtype(), device());
  if (auto node = detail::make_node<CopyBackward>(out, {*this})) {
    node->input_dtype = dtype();
    node->input_device = device();
  }
  return out;
}

Tensor Tensor::to(DType target) const {
  if (target == dtype()) return *this;
  Tensor out = copy_of(*this, target, device());
  if (is_floating(target)) {
    if (auto node = detail::make_node<CopyBackward>(out, {*this})) {
      node->input_dtype = dtype();
      node->input_device = device();
    }
  }
  return out;
}

Tensor Tensor::to(Device target) const {
  if (target == device()) return *this;
  Tensor out = copy_of(*this, dtype(), target);
  if (auto node = detail::make_node<CopyBackward>(out, {*this})) {
    node->input_dtype = dtype();
    node->input_device = device();
  }
  return out;
}

}  // namespace pipit
