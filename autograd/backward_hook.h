#pragma once
// backward_hook: x itself in the forward (a view of the same memory); in the backward, calls
// hook() when x's gradient arrives, then passes the gradient on unchanged. A pipeline stage
// puts one after each layer to time the layers' backward passes.
#include <functional>

#include "tensor/tensor.h"

namespace pipit {

Tensor backward_hook(const Tensor& x, std::function<void()> hook);

}  // namespace pipit
