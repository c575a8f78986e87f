#pragma once
// Every differentiable operation.
#include "autograd/attention.h"
#include "autograd/backward_hook.h"
#include "autograd/conv.h"
#include "autograd/elementwise.h"
#include "autograd/grad_mode.h"
#include "autograd/matmul.h"
#include "autograd/nn_ops.h"
#include "autograd/reduce.h"
#include "autograd/shape_ops.h"
