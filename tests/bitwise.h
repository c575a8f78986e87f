#pragma once
// Bit-for-bit equality of tensors: what the equivalence tests promise.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "nn/module.h"
#include "pipit.h"

namespace pipit::testing {

// Tensors on a GPU are compared on the host: raw_data() of device memory is no host pointer.
inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Tensor x = a.to(Device::cpu()).contiguous(), y = b.to(Device::cpu()).contiguous();
  return std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

// The largest |a - b| over all elements, for results that may differ only by rounding.
inline double max_abs_difference(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

// The same names, each tensor with the same bits.
inline void check_bitwise_equal(const StateDict& actual, const StateDict& expected) {
  REQUIRE(actual.size() == expected.size());
  for (const auto& [name, tensor] : expected) {
    INFO(name);
    REQUIRE(actual.count(name));
    CHECK(bitwise_equal(actual.at(name), tensor));
  }
}

}  // namespace pipit::testing
