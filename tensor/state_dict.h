#pragma once
#include <map>
#include <string>

#include "tensor/tensor.h"

namespace pipit {

// Named tensors: module parameters ("3.attn.qkv.weight") or optimizer state. Sorted by name.
using StateDict = std::map<std::string, Tensor>;

}  // namespace pipit
