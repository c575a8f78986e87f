#pragma once
// make_node, the helper for defining differentiable ops, lives in tensor/node.h (Tensor's own
// differentiable copies use it); this header keeps the autograd/ include path.
#include "tensor/node.h"
