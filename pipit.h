#pragma once
// The whole public API in one include.
#include "autograd/autocast.h"
#include "autograd/ops.h"
#include "tensor/backend.h"
#include "tensor/factory.h"
#include "tensor/parallel.h"
#include "tensor/precision.h"
#include "tensor/stream.h"
#include "tensor/tensor.h"
