#pragma once
// Linear's weight gradient (Backend::matmul_bias_grad) sums over every row of the batch. When
// its output has fewer 128 x 128 tiles than an H100 or H200 has SMs (GPT-2 small's attention
// projections: 768 x 768 is 36 tiles), most SMs idle through the product. With parts > 1
// such a product is split over `parts` equal runs of rows: one batched cuBLASLt call (the bias
// gradient of each run in its epilogue), then the runs' results added in order. The bits
// depend on the shape and this setting only, so training stays deterministic; a setting that
// a shape cannot take (rows not divisible, runs under 1024 rows) leaves it whole.
#include <cstdint>

namespace pipit::cuda {

// For every thread and device: 1 (whole, the default), 2 or 4; other values throw.
void set_weight_gradient_parts(int parts);
int weight_gradient_parts();

// Products split so far in this process, and splits the shape allowed but cuBLASLt refused
// (those ran whole): a split that did not happen, told apart from one that went wrong.
struct WeightGradientSplits {
  int64_t taken = 0, refused = 0;
};
WeightGradientSplits weight_gradient_splits();

}  // namespace pipit::cuda
