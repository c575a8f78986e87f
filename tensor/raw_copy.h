#pragma once
// Copies that record no graph, for the layers below autograd/ (codec/, comm/) and for
// autograd/'s own copies, which add their node around them (Tensor::clone and Tensor::to).
#include "tensor/tensor.h"

namespace pipit {

// A new contiguous tensor of `dtype` on `device` holding x's values.
Tensor copy_of(const Tensor& x, DType dtype, Device device);
// x itself when it is on `device` already, else copy_of(x, x.dtype(), device).
Tensor to_device(const Tensor& x, Device device);
// x's bytes as host memory in row-major order, as a file or a socket takes them: x itself
// when they already lie so, else a copy.
Tensor host_contiguous(const Tensor& x);

}  // namespace pipit
