#include "autograd/conv.h"

#include "autograd/elementwise.h"
#include "autograd/node.h"
#include "autograd/reduce.h"
#include "autograd/shape_ops.h"
#include "tensor/backend.h"

namespace pipit {
namespace {

// Checks x and the window, and returns the output's (height, width).
Size2 output_size(const char* op, const Tensor& x, Size2 kernel, Size2 stride, Size2 padding,
                  Size2 dilation) {
  PIPIT_CHECK(x.dim() == 4, op, ": input must be [N, C, H, W], got ", shape_str(x.shape()));
  PIPIT_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::f64, op,
              ": needs an F32 or F64 input, got ", x.dtype());
  PIPIT_CHECK(kernel.h > 0 && kernel.w > 0 && stride.h > 0 && stride.w > 0 && dilation.h > 0 &&
                  dilation.w > 0 && padding.h >= 0 && padding.w >= 0,
              op, ": kernel (", kernel.h, ", ", kernel.w, "), stride (", stride.h, ", ", stride.w,
              ") and dilation (", dilation.h, ", ", dilation.w, ") must be positive and padding (",
              padding.h, ", ", padding.w, ") non-negative");
  const int64_t span_h = x.shape()[2] + 2 * padding.h - dilation.h * (kernel.h - 1) - 1;
  const int64_t span_w = x.shape()[3] + 2 * padding.w - dilation.w * (kernel.w - 1) - 1;
  PIPIT_CHECK(span_h >= 0 && span_w >= 0, op, ": kernel (", kernel.h, ", ", kernel.w,
              ") with dilation (", dilation.h, ", ", dilation.w, ") does not fit input ",
              shape_str(x.shape()), " padded by (", padding.h, ", ", padding.w, ")");
  return {span_h / stride.h + 1, span_w / stride.w + 1};
}

void check_same_device(const char* op, const char* what, const Tensor& t, const Tensor& x) {
  PIPIT_CHECK(t.device() == x.device(), op, ": ", what, " is on ", t.device().str(),
              " but the input is on ", x.device().str());
}

Tensor empty_like(const Tensor& t) {
  return Tensor::empty(t.shape(), t.dtype(), t.device());
}

struct Conv2dBackward : Node {
  Tensor x, weight;
  Conv2dGeometry geometry{};
  std::vector<Tensor> apply(const Tensor& grad) override {
    Tensor gx, gw, gb;
    if (next[0]) {
      gx = empty_like(x);
      backend(grad).conv2d_backward_input(grad, weight, geometry, gx);
    }
    if (next[1]) {
      gw = empty_like(weight);
      backend(grad).conv2d_backward_weight(grad, x, geometry, gw);
    }
    if (next.size() == 2) return {gx, gw};
    if (next[2]) gb = sum(grad, {0, 2, 3});
    return {gx, gw, gb};
  }
  std::string name() const override { return "Conv2dBackward"; }
};

struct MaxPool2dBackward : Node {
  Tensor argmax;
  Shape input_shape;
  Pool2dGeometry window{};
  std::vector<Tensor> apply(const Tensor& grad) override {
    Tensor gx = Tensor::empty(input_shape, grad.dtype(), grad.device());
    backend(grad).max_pool2d_backward(grad, argmax, window, gx);
    return {gx};
  }
  std::string name() const override { return "MaxPool2dBackward"; }
};

struct AvgPool2dBackward : Node {
  Shape input_shape;
  Pool2dGeometry window{};
  std::vector<Tensor> apply(const Tensor& grad) override {
    Tensor gx = Tensor::empty(input_shape, grad.dtype(), grad.device());
    backend(grad).avg_pool2d_backward(grad, window, gx);
    return {gx};
  }
  std::string name() const override { return "AvgPool2dBackward"; }
};

// Checks the pool's window and returns it with the output's shape.
std::pair<Pool2dGeometry, Shape> pool_window(const char* op, const Tensor& x, Size2 kernel,
                                             Size2 stride, Size2 padding) {
  const Size2 out = output_size(op, x, kernel, stride, padding, 1);
  // PyTorch's limit: wider padding would let a window see padding only.
  PIPIT_CHECK(2 * padding.h <= kernel.h && 2 * padding.w <= kernel.w, op, ": padding (", padding.h,
              ", ", padding.w, ") must be at most half the kernel (", kernel.h, ", ", kernel.w,
              ")");
  return {{kernel.h, kernel.w, stride.h, stride.w, padding.h, padding.w},
          {x.shape()[0], x.shape()[1], out.h, out.w}};
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Size2 stride,
              Size2 padding, Size2 dilation) {
  PIPIT_CHECK(weight.dim() == 4, "conv2d: weight must be [O, C, kh, kw], got ",
              shape_str(weight.shape()));
  const Size2 out_size = output_size("conv2d", x, Size2(weight.shape()[2], weight.shape()[3]),
                                     stride, padding, dilation);
  const int64_t O = weight.shape()[0];
  PIPIT_CHECK(weight.shape()[1] == x.shape()[1], "conv2d: input of shape ", shape_str(x.shape()),
              " does not match weight of shape ", shape_str(weight.shape()), " (channels ",
              x.shape()[1], " vs ", weight.shape()[1], ")");
  PIPIT_CHECK(x.dtype() == weight.dtype(), "conv2d: input dtype ", x.dtype(),
              " differs from weight dtype ", weight.dtype());
  check_same_device("conv2d", "weight", weight, x);
  if (bias.defined()) {
    PIPIT_CHECK(bias.shape() == Shape{O}, "conv2d: bias of shape ", shape_str(bias.shape()),
                " does not match weight of shape ", shape_str(weight.shape()));
    PIPIT_CHECK(bias.dtype() == x.dtype(), "conv2d: bias dtype ", bias.dtype(),
                " differs from input dtype ", x.dtype());
    check_same_device("conv2d", "bias", bias, x);
  }
  const Conv2dGeometry geometry{stride.h, stride.w, padding.h, padding.w, dilation.h, dilation.w};
  Tensor out = Tensor::empty({x.shape()[0], O, out_size.h, out_size.w}, x.dtype(), x.device());
  backend(x).conv2d(x.detach(), weight.detach(), geometry, out);
  if (bias.defined()) {
    NoGradGuard no_grad;
    out = out + reshape(bias, {1, O, 1, 1});
  }
  auto node = bias.defined() ? detail::make_node<Conv2dBackward>(out, {x, weight, bias})
                             : detail::make_node<Conv2dBackward>(out, {x, weight});
  if (node) {
    node->x = x.detach();
    node->weight = weight.detach();
    node->geometry = geometry;
  }
  return out;
}

Tensor max_pool2d(const Tensor& x, Size2 kernel, Size2 stride, Size2 padding) {
  const auto [window, out_shape] = pool_window("max_pool2d", x, kernel, stride, padding);
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  Tensor argmax = Tensor::empty(out_shape, DType::i64, x.device());
  backend(x).max_pool2d(x.detach(), window, out, argmax);
  if (auto node = detail::make_node<MaxPool2dBackward>(out, {x})) {
    node->argmax = argmax;
    node->input_shape = x.shape();
    node->window = window;
  }
  return out;
}

Tensor avg_pool2d(const Tensor& x, Size2 kernel, Size2 stride, Size2 padding) {
  const auto [window, out_shape] = pool_window("avg_pool2d", x, kernel, stride, padding);
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  backend(x).avg_pool2d(x.detach(), window, out);
  if (auto node = detail::make_node<AvgPool2dBackward>(out, {x})) {
    node->input_shape = x.shape();
    node->window = window;
  }
  return out;
}

}  // namespace pipit
