#include "tensor/factory.h"

#include <cmath>
#include <cstring>

#include "tensor/backend.h"

namespace pipit {

Tensor empty(const Shape& shape, TensorOptions options) {
  return Tensor::empty(shape, options.dtype, options.device);
}

Tensor full(const Shape& shape, double value, TensorOptions options) {
  Tensor t = empty(shape, options);
  backend(options.device).fill(t, value);
  return t;
}

Tensor zeros(const Shape& shape, TensorOptions options) {
  return full(shape, 0.0, options);
}
Tensor ones(const Shape& shape, TensorOptions options) {
  return full(shape, 1.0, options);
}
Tensor zeros_like(const Tensor& t) {
  return zeros(t.shape(), {t.dtype(), t.device()});
}
Tensor ones_like(const Tensor& t) {
  return ones(t.shape(), {t.dtype(), t.device()});
}

Tensor arange(double start, double end, double step, TensorOptions options) {
  PIPIT_CHECK(step != 0, "arange: step must be non-zero");
  int64_t n = std::max<int64_t>(0, static_cast<int64_t>(std::ceil((end - start) / step)));
  Tensor t = empty({n}, options);
  backend(options.device).arange(t, start, step);
  return t;
}

template <typename T>
Tensor from_vector(const std::vector<T>& values, Shape shape) {
  if (shape.empty()) shape = {static_cast<int64_t>(values.size())};
  PIPIT_CHECK(shape_numel(shape) == static_cast<int64_t>(values.size()),
              "from_vector: ", values.size(), " values do not fill shape ", shape_str(shape));
  Tensor t = Tensor::empty(shape, DTypeOf<T>::value);
  if constexpr (std::is_same_v<T, bool>) {
    bool* p = t.data<bool>();
    for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  } else {
    std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(T));
  }
  return t;
}

template Tensor from_vector<float>(const std::vector<float>&, Shape);
template Tensor from_vector<double>(const std::vector<double>&, Shape);
template Tensor from_vector<int32_t>(const std::vector<int32_t>&, Shape);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, Shape);
template Tensor from_vector<bool>(const std::vector<bool>&, Shape);

Tensor scalar_tensor(double value, TensorOptions options) {
  return full({}, value, options);
}

Tensor uniform(const Shape& shape, double low, double high, Generator* generator,
               TensorOptions options) {
  Tensor t = empty(shape, options);
  backend(options.device).uniform(t, generator ? *generator : default_generator(), low, high);
  return t;
}

Tensor normal(const Shape& shape, double mean, double std, Generator* generator,
              TensorOptions options) {
  Tensor t = empty(shape, options);
  backend(options.device).normal(t, generator ? *generator : default_generator(), mean, std);
  return t;
}

Tensor rand(const Shape& shape, Generator* generator, TensorOptions options) {
  return uniform(shape, 0.0, 1.0, generator, options);
}

Tensor randn(const Shape& shape, Generator* generator, TensorOptions options) {
  return normal(shape, 0.0, 1.0, generator, options);
}

}  // namespace pipit
