#pragma once
// Tensor factories. Random factories draw from `generator` (default_generator() when null),
// so a seeded run is reproducible.
#include <initializer_list>
#include <vector>

#include "tensor/generator.h"
#include "tensor/tensor.h"

namespace pipit {

struct TensorOptions {
  DType dtype = DType::f32;
  Device device = Device::cpu();
};

Tensor empty(const Shape& shape, TensorOptions options = {});
Tensor zeros(const Shape& shape, TensorOptions options = {});
Tensor ones(const Shape& shape, TensorOptions options = {});
Tensor full(const Shape& shape, double value, TensorOptions options = {});
// [start, end) in steps of `step`.
Tensor arange(double start, double end, double step = 1.0, TensorOptions options = {DType::i64});
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);

// Copies `values` into a new tensor of `shape` (default: 1-D); the dtype follows T.
// A 0-dim tensor comes from scalar_tensor.
template <typename T>
Tensor from_vector(const std::vector<T>& values, Shape shape = {});
inline Tensor tensor(std::initializer_list<float> values, Shape shape = {}) {
  return from_vector(std::vector<float>(values), std::move(shape));
}
// A 0-dim tensor holding `value`.
Tensor scalar_tensor(double value, TensorOptions options = {});

Tensor rand(const Shape& shape, Generator* generator = nullptr, TensorOptions options = {});
Tensor randn(const Shape& shape, Generator* generator = nullptr, TensorOptions options = {});
Tensor uniform(const Shape& shape, double low, double high, Generator* generator = nullptr,
               TensorOptions options = {});
Tensor normal(const Shape& shape, double mean, double std, Generator* generator = nullptr,
              TensorOptions options = {});

}  // namespace pipit
