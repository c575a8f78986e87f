#pragma once
// Reductions over any set of dims (negative dims count from the end; empty dims = all).
#include <vector>

#include "tensor/tensor.h"

namespace pipit {

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Largest value over dims; gradient shared evenly among tied maxima.
Tensor max(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor min(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Variance with Bessel's correction by default (correction = 1), as torch.var.
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false,
           int64_t correction = 1);
// Index of the largest value along dim (i64, not differentiable).
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);

}  // namespace pipit
