#pragma once
// Grad mode lives in tensor/grad_mode.h, beside the engine behind Tensor::backward; this
// header keeps the autograd/ include that nn/, optim/ and users write.
#include "tensor/grad_mode.h"
