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

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.contiguous().raw_data(), b.contiguous().raw_data(), a.nbytes()) == 0;
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
