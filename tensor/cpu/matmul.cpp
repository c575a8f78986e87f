// Matrix products through OpenBLAS. Each operand is passed to GEMM as it lies in memory when
// its last two dims are row- or column-major; only other layouts are copied first.
#include <cblas.h>

#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/loop.h"

namespace pipit {
namespace {

// How one operand's trailing [rows, cols] matrix is laid out for GEMM.
struct MatrixLayout {
  bool transposed = false;
  int64_t ld = 0;
  bool usable = false;
};

MatrixLayout layout_of(const Tensor& t) {
  const int64_t r = t.dim();
  const int64_t rows = t.shape()[r - 2], cols = t.shape()[r - 1];
  const int64_t s_row = t.strides()[r - 2], s_col = t.strides()[r - 1];
  if ((s_col == 1 || cols == 1) && s_row >= std::max<int64_t>(1, cols)) return {false, s_row, true};
  if ((s_row == 1 || rows == 1) && s_col >= std::max<int64_t>(1, rows)) return {true, s_col, true};
  return {};
}

template <typename T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc) {
  auto trans = [](bool t) { return t ? CblasTrans : CblasNoTrans; };
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, trans(ta), trans(tb), static_cast<int>(M), static_cast<int>(N),
                static_cast<int>(K), 1.0f, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
                c, static_cast<int>(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, trans(ta), trans(tb), static_cast<int>(M), static_cast<int>(N),
                static_cast<int>(K), 1.0, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
                c, static_cast<int>(ldc));
  }
}

Tensor gemm_ready(const Tensor& t) {
  if (layout_of(t).usable) return t;
  Tensor copy = Tensor::empty(t.shape(), t.dtype(), t.device());
  backend(t).copy(t, copy);
  return copy;
}

// True when a's batch dims and rows merge into one row-major run of matrices, so that a
// batch against a broadcast b is a single GEMM with M * batch rows.
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

template <typename T>
void matmul_typed(const Tensor& a_in, const Tensor& b_in, const Tensor& out, bool accumulate) {
  const T beta = accumulate ? T(1) : T(0);
  const Tensor a = gemm_ready(a_in), b = gemm_ready(b_in);
  const MatrixLayout la = layout_of(a), lb = layout_of(b);
  const int64_t r = out.dim();
  const int64_t M = out.shape()[r - 2], N = out.shape()[r - 1], K = a.shape()[r - 1];
  T* c = out.data<T>();
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  int64_t batch = 1;
  bool b_broadcast = true;
  for (int64_t d = 0; d < r - 2; ++d) {
    batch *= out.shape()[d];
    if (b.strides()[d] != 0 && b.shape()[d] != 1) b_broadcast = false;
  }
  if (M == 0 || N == 0) return;
  if (K == 0) {
    if (!accumulate) std::fill(c, c + out.numel(), T(0));
    return;
  }
  if (batch == 1 || (b_broadcast && batch_folds_into_rows(a, la))) {
    gemm<T>(la.transposed, lb.transposed, M * batch, N, K, pa, la.ld, pb, lb.ld, beta, c, N);
    return;
  }
  Shape index(static_cast<size_t>(r - 2), 0);
  for (int64_t i = 0; i < batch; ++i) {
    int64_t off_a = 0, off_b = 0;
    for (int64_t d = 0; d < r - 2; ++d) {
      off_a += index[d] * a.strides()[d];
      off_b += index[d] * b.strides()[d];
    }
    gemm<T>(la.transposed, lb.transposed, M, N, K, pa + off_a, la.ld, pb + off_b, lb.ld, beta,
            c + i * M * N, N);
    for (int64_t d = r - 3; d >= 0 && ++index[d] == out.shape()[d]; --d) index[d] = 0;
  }
}

}  // namespace

void CpuBackend::matmul(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate) {
  PIPIT_CHECK(out.is_contiguous(), "matmul: output must be contiguous");
  PIPIT_DISPATCH_FLOAT(a.dtype(), "matmul", matmul_typed<scalar_t>(a, b, out, accumulate));
}

}  // namespace pipit
