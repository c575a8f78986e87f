#pragma once
// Node and AccumulateGrad live in tensor/node.h, beside the engine behind Tensor::backward;
// this header keeps the autograd/ include path.
#include "tensor/node.h"
