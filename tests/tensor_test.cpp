#include <catch2/catch.hpp>

#include "pipit.h"

using namespace pipit;
using Catch::Approx;

TEST_CASE("broadcast add and matmul values", "[tensor]") {
  Tensor a = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = from_vector<float>({10, 20, 30}, {3});
  std::vector<float> sum_values = (a + b).to_vector<float>();
  CHECK(sum_values == std::vector<float>{11, 22, 33, 14, 25, 36});
  Tensor m = matmul(a, transpose(a, 0, 1));
  CHECK(m.to_vector<float>() == std::vector<float>{14, 32, 32, 77});
}
