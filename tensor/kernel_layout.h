#pragma once
// Layout helpers the backends' kernels share. No autograd: the differentiable forms are
// Tensor::contiguous and the view ops in autograd/.
#include <cstdint>

#include "tensor/tensor.h"

namespace pipit {

// t itself when contiguous, else a contiguous copy on t's device.
Tensor dense(const Tensor& t);
// A view of t with `dim` moved last.
Tensor dim_last(const Tensor& t, int64_t dim);
// What Backend::causal_softmax and its backward need: square scores [..., T, T] and a
// contiguous output of their shape.
void check_causal_softmax(const char* op, const Tensor& scores, const Tensor& out);

}  // namespace pipit
