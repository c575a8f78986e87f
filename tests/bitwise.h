#pragma once
// Bit-for-bit equality of tensors: what the equivalence tests promise.
#include <cstring>

#include "pipit.h"

namespace pipit::testing {

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.contiguous().raw_data(), b.contiguous().raw_data(), a.nbytes()) == 0;
}

}  // namespace pipit::testing
