#pragma once
// How matmul operands lie in memory, as every BLAS-backed backend needs to know: a trailing
// [rows, cols] matrix that is row- or column-major can go to GEMM as it lies (a transpose is
// free), and a batch whose matrices follow each other as rows can fold into one GEMM.
#include <cstdint>

#include "tensor/tensor.h"

namespace pipit {

struct MatrixLayout {
  bool transposed = false;  // column-major: hand GEMM the transpose
  int64_t ld = 0;           // leading dimension
  bool usable = false;      // false: neither layout, copy to contiguous first
};

MatrixLayout layout_of(const Tensor& t);
// True when a's batch dims and rows merge into one row-major run of matrices, so that a
// batch against a broadcast b is a single GEMM with M * batch rows.
bool batch_folds_into_rows(const Tensor& a, const MatrixLayout& la);

// out's batch size, and whether a x b is one GEMM of M * batch rows (b broadcast, a folds).
struct BatchFold {
  int64_t batch = 1;
  bool folds = true;
};
BatchFold batch_fold(const Tensor& a, const MatrixLayout& la, const Tensor& b, const Tensor& out);

// The checks matmul_bias and matmul_bias_grad share (Backend): 2-D a [M, K], b [K, N] and a
// contiguous out [M, N] whose dtype goes with theirs, and a contiguous vector of `length`
// elements in out's dtype (none for an undefined vector: matmul_dgelu's).
void check_matmul_with_vector(const char* op, const Tensor& a, const Tensor& b, const Tensor& out,
                              const Tensor& vector, int64_t length);
// matmul_bias_gelu's pre and out: one shape and dtype, contiguous.
void check_matmul_with_gelu(const char* op, const Tensor& pre, const Tensor& out);
// `vector` [N] as a [rows, N] view that repeats it in every row.
Tensor rows_of(const Tensor& vector, int64_t rows);

}  // namespace pipit
