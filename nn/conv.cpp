#include "nn/conv.h"

#include <cmath>

#include "autograd/ops.h"
#include "tensor/factory.h"

namespace pipit {
namespace {

json pair(Size2 s) {
  return json::array({s.h, s.w});
}

}  // namespace

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel, Size2 stride, Size2 padding,
               bool use_bias, Generator* generator)
    : in_(in_channels), out_(out_channels), kernel_(kernel), stride_(stride), padding_(padding) {
  PIPIT_CHECK(in_channels > 0 && out_channels > 0 && kernel.h > 0 && kernel.w > 0,
              "Conv2d: channels and kernel must be positive, got ", in_channels, " -> ",
              out_channels, " with kernel (", kernel.h, ", ", kernel.w, ")");
  // The fan-in in double: in * kh * kw can overflow int64 for sizes from a config, which the
  // weight's shape check below refuses.
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_) * static_cast<double>(kernel.h) *
                                       static_cast<double>(kernel.w));
  weight = register_parameter("weight",
                              uniform({out_, in_, kernel.h, kernel.w}, -bound, bound, generator));
  if (use_bias) bias = register_parameter("bias", uniform({out_}, -bound, bound, generator));
}

Tensor Conv2d::forward(const Tensor& x) {
  return conv2d(x, weight, bias, stride_, padding_);
}

json Conv2d::config() const {
  return {{"type", "Conv2d"},
          {"in", in_},
          {"out", out_},
          {"kernel", pair(kernel_)},
          {"stride", pair(stride_)},
          {"padding", pair(padding_)},
          {"bias", bias.defined()}};
}

MaxPool2d::MaxPool2d(Size2 kernel, Size2 stride, Size2 padding)
    : kernel_(kernel), stride_(stride), padding_(padding) {}

Tensor MaxPool2d::forward(const Tensor& x) {
  return max_pool2d(x, kernel_, stride_, padding_);
}

json MaxPool2d::config() const {
  return {{"type", "MaxPool2d"},
          {"kernel", pair(kernel_)},
          {"stride", pair(stride_)},
          {"padding", pair(padding_)}};
}

AvgPool2d::AvgPool2d(Size2 kernel, Size2 stride, Size2 padding)
    : kernel_(kernel), stride_(stride), padding_(padding) {}

Tensor AvgPool2d::forward(const Tensor& x) {
  return avg_pool2d(x, kernel_, stride_, padding_);
}

json AvgPool2d::config() const {
  return {{"type", "AvgPool2d"},
          {"kernel", pair(kernel_)},
          {"stride", pair(stride_)},
          {"padding", pair(padding_)}};
}

Flatten::Flatten(int64_t start_dim, int64_t end_dim) : start_(start_dim), end_(end_dim) {}

Tensor Flatten::forward(const Tensor& x) {
  return flatten(x, start_, end_);
}

json Flatten::config() const {
  return {{"type", "Flatten"}, {"start_dim", start_}, {"end_dim", end_}};
}

}  // namespace pipit
