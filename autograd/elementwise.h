#pragma once
// Elementwise operations with NumPy broadcasting. Both operands must share a dtype; scalar
// forms take a double converted to the tensor's dtype. Comparisons return b8 masks.
#include "tensor/tensor.h"

namespace pipit {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, double exponent);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);

Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);  // tanh approximation, as GPT-2

Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);

// where(mask, a, b): a where mask is true, else b (all three broadcast together).
Tensor where(const Tensor& mask, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

// A 0-dim tensor of x's dtype and device holding `value`.
Tensor scalar_like(const Tensor& x, double value);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& x);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);

}  // namespace pipit
