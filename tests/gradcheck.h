#pragma once
// Compares autograd gradients with central finite differences in f64.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <sstream>
#include <vector>

#include "pipit.h"

namespace pipit::testing {

using Fn = std::function<pipit::Tensor(const std::vector<pipit::Tensor>&)>;

// f64 leaves of the given shapes, drawn from a fixed seed; `offset` shifts them (e.g. away
// from 0 for log/sqrt).
inline std::vector<pipit::Tensor> leaves(const std::vector<pipit::Shape>& shapes, uint64_t seed = 7,
                                         double offset = 0.0) {
  pipit::Generator generator(seed);
  std::vector<pipit::Tensor> out;
  for (const auto& shape : shapes) {
    pipit::Tensor t = pipit::randn(shape, &generator, {pipit::DType::f64}) + offset;
    out.push_back(t.detach().requires_grad_());
  }
  return out;
}

// For every element of every input: d(sum(f * g))/dx by central differences against the
// autograd gradient, for a fixed random upstream gradient g.
inline void check_gradients(const Fn& f, std::vector<pipit::Tensor> inputs,
                            double tolerance = 1e-6) {
  using namespace pipit;
  for (Tensor& t : inputs) t.zero_grad();
  Tensor out = f(inputs);
  Generator generator(99);
  Tensor upstream = randn(out.shape(), &generator, {DType::f64});
  out.backward(upstream);
  constexpr double eps = 1e-6;
  auto objective = [&]() {
    NoGradGuard no_grad;
    return sum(f(inputs) * upstream).item<double>();
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].requires_grad()) continue;
    Tensor grad = inputs[i].grad();
    std::vector<double> analytic =
        grad.defined() ? grad.to_vector<double>() : std::vector<double>(inputs[i].numel(), 0.0);
    double* x = inputs[i].data<double>();
    for (int64_t j = 0; j < inputs[i].numel(); ++j) {
      const double saved = x[j];
      x[j] = saved + eps;
      const double plus = objective();
      x[j] = saved - eps;
      const double minus = objective();
      x[j] = saved;
      const double numeric = (plus - minus) / (2 * eps);
      const double error = std::abs(numeric - analytic[static_cast<size_t>(j)]);
      if (error > tolerance * (1.0 + std::abs(numeric))) {
        std::ostringstream message;
        message << "input " << i << " element " << j << ": numeric " << numeric << " autograd "
                << analytic[static_cast<size_t>(j)];
        FAIL(message.str());
      }
    }
  }
  SUCCEED();
}

}  // namespace pipit::testing
