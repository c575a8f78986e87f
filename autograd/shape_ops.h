#pragma once
// Shape operations. Views (reshape when possible, transpose, permute, narrow, slice, expand,
// squeeze, unsqueeze) share storage with their input; all are differentiable.
#include <vector>

#include "tensor/tensor.h"

namespace pipit {

Tensor view(const Tensor& x, Shape shape);     // throws if the layout does not allow a view
Tensor reshape(const Tensor& x, Shape shape);  // view when possible, else copy; one dim may be -1
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor expand(const Tensor& x, const Shape& shape);  // broadcast view; -1 keeps a dim
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor unsqueeze(const Tensor& x, int64_t dim);

Tensor cat(const std::vector<Tensor>& xs, int64_t dim);
Tensor stack(const std::vector<Tensor>& xs, int64_t dim);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim);

// Sums a broadcast result back down to `shape` (the gradient of expand).
Tensor sum_to(const Tensor& x, const Shape& shape);

}  // namespace pipit
