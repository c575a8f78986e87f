#pragma once
// 2-D convolution and pooling over [N, C, H, W] inputs (f32 or f64) on any backend.
#include <cstdint>

#include "tensor/tensor.h"

namespace pipit {

// A (height, width) pair; one integer means the same for both, as in PyTorch.
struct Size2 {
  int64_t h = 0, w = 0;
  Size2(int64_t both = 0) : h(both), w(both) {}
  Size2(int64_t height, int64_t width) : h(height), w(width) {}
  bool operator==(const Size2&) const = default;
};

// x [N, C, H, W] * weight [O, C, kh, kw] (+ bias [O], or undefined) -> [N, O, OH, OW], as
// torch.nn.functional.conv2d with groups = 1.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Size2 stride = 1,
              Size2 padding = 0, Size2 dilation = 1);
// Padding counts as -inf; the gradient goes to the first maximum of each window.
Tensor max_pool2d(const Tensor& x, Size2 kernel, Size2 stride, Size2 padding = 0);
// Padding counts as zeros in the mean (PyTorch's count_include_pad = true).
Tensor avg_pool2d(const Tensor& x, Size2 kernel, Size2 stride, Size2 padding = 0);

}  // namespace pipit
