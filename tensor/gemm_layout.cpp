#include "tensor/gemm_layout.h"

#include <algorithm>

namespace pipit {

MatrixLayout layout_of(const Tensor& t) {
  const int64_t r = t.dim();
  const int64_t rows = t.shape()[r - 2], cols = t.shape()[r - 1];
  const int64_t s_row = t.strides()[r - 2], s_col = t.strides()[r - 1];
  if ((s_col == 1 || cols == 1) && s_row >= std::max<int64_t>(1, cols)) return {false, s_row, true};
  if ((s_row == 1 || rows == 1) && s_col >= std::max<int64_t>(1, rows)) return {true, s_col, true};
  return {};
}

bool batch_folds_into_rows(const Tensor& a, const MatrixLayout& la) {
  if (la.transposed) return false;
  const int64_t r = a.dim();
  int64_t expected = a.strides()[r - 2] * a.shape()[r - 2];
  for (int64_t d = r - 3; d >= 0; --d) {
    if (a.shape()[d] != 1 && a.strides()[d] != expected) return false;
    expected *= a.shape()[d];
  }
  return true;
}

BatchFold batch_fold(const Tensor& a, const MatrixLayout& la, const Tensor& b, const Tensor& out) {
  BatchFold fold;  // folds: b broadcast so far
  for (int64_t d = 0; d < out.dim() - 2; ++d) {
    fold.batch *= out.shape()[d];
    fold.folds = fold.folds && (b.strides()[d] == 0 || b.shape()[d] == 1);
  }
  fold.folds = fold.batch == 1 || (fold.folds && batch_folds_into_rows(a, la));
  return fold;
}

void check_matmul_with_vector(const char* op, const Tensor& a, const Tensor& b, const Tensor& out,
                              const Tensor& vector, int64_t length) {
  PIPIT_CHECK(a.dim() == 2 && b.dim() == 2 && out.dim() == 2 && a.shape()[1] == b.shape()[0] &&
                  out.shape() == Shape({a.shape()[0], b.shape()[1]}),
              op, ": expects a [M, K], b [K, N] and out [M, N], got ", shape_str(a.shape()), ", ",
              shape_str(b.shape()), " and ", shape_str(out.shape()));
  PIPIT_CHECK(out.is_contiguous() && (!vector.defined() || vector.is_contiguous()), op,
              ": out and the vector must be contiguous");
  const bool half = is_half(a.dtype());
  PIPIT_CHECK(
      a.dtype() == b.dtype() && (out.dtype() == a.dtype() || (half && out.dtype() == DType::f32)),
      op, ": dtypes ", a.dtype(), ", ", b.dtype(), " and out ", out.dtype(), " do not go together");
  PIPIT_CHECK(
      !vector.defined() || (vector.shape() == Shape{length} && vector.dtype() == out.dtype()), op,
      ": the vector must be [", length, "] in ", out.dtype(), ", got ", shape_str(vector.shape()),
      " in ", vector.dtype());
}

void check_matmul_with_gelu(const char* op, const Tensor& pre, const Tensor& out) {
  PIPIT_CHECK(pre.shape() == out.shape() && pre.dtype() == out.dtype() && pre.is_contiguous(), op,
              ": pre must be contiguous with out's shape ", shape_str(out.shape()), " and dtype ",
              out.dtype(), ", got ", shape_str(pre.shape()), " in ", pre.dtype());
}

Tensor rows_of(const Tensor& vector, int64_t rows) {
  return Tensor::from_storage(vector.storage(), {rows, vector.shape()[0]}, {0, vector.strides()[0]},
                              vector.offset(), vector.dtype());
}

}  // namespace pipit
