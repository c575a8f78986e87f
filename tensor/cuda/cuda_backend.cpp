// CUDA memory and matrix products. GEMM goes to cuBLAS with every operand as it lies in memory
// when its last two dims are row- or column-major, as the CPU backend passes them to BLAS.
#include "tensor/cuda/cuda_backend.h"
#include "tensor/gemm_layout.h"

#include <limits>
#include <mutex>
#include <vector>

#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/cuda_device.h"

namespace pipit {
namespace {

// One cuBLAS handle per device, created on first use and never destroyed (the driver may be
// gone by static teardown). Calls only enqueue work, so serialising them costs little, and a
// handle must not be used from two threads at once.
struct Blas {
  std::mutex mutex;
  cublasHandle_t handle = nullptr;
};

Blas& blas(int device) {
  static std::mutex mutex;
  static std::vector<Blas*> handles;
  std::lock_guard<std::mutex> lock(mutex);
  if (handles.empty()) handles.resize(static_cast<size_t>(cuda::device_count()), nullptr);
  Blas*& b = handles.at(static_cast<size_t>(device));
  if (!b) {
    b = new Blas();
    PIPIT_CUBLAS_CHECK("matmul", cublasCreate(&b->handle));
    // Full f32 precision: TF32 tensor cores would change results at the 1e-3 level.
    PIPIT_CUBLAS_CHECK("matmul", cublasSetMathMode(b->handle, CUBLAS_DEFAULT_MATH));
  }
  return *b;
}

// The stride between consecutive matrices when t's batch dims walk memory evenly (broadcast
// batches give 0), or -1 when they do not.
int64_t batch_stride(const Tensor& t) {
  const int64_t r = t.dim();
  int64_t stride = -1, span = 1;
  for (int64_t d = r - 3; d >= 0; --d) {
    const int64_t n = t.shape()[d];
    if (n == 1) continue;
    if (stride < 0) {
      stride = t.strides()[d];
    } else if (t.strides()[d] != stride * span) {
      return -1;
    }
    span *= n;
  }
  return stride < 0 ? 0 : stride;
}

// t itself when cuBLAS can read it in place, else a contiguous copy on the device.
Tensor gemm_ready(const Tensor& t) {
  if (layout_of(t).usable && batch_stride(t) >= 0) return t;
  Tensor copy = Tensor::empty(t.shape(), t.dtype(), t.device());
  backend(t).copy(t, copy);
  return copy;
}

int as_int(int64_t v, const char* what) {
  PIPIT_CHECK(v <= std::numeric_limits<int>::max(), "matmul: ", what, " ", v,
              " exceeds cuBLAS's int range");
  return static_cast<int>(v);
}

// Row-major C[M, N] = A[M, K] B[K, N] is column-major C^T = B^T A^T: cuBLAS gets B as its
// first operand and A as its second, each transposed exactly when it is column-major here.
template <typename T>
void gemm(cublasHandle_t handle, const MatrixLayout& la, const MatrixLayout& lb, int64_t M,
          int64_t N, int64_t K, const T* a, int64_t stride_a, const T* b, int64_t stride_b, T beta,
          T* c, int64_t batch) {
  const T alpha = T(1);
  const cublasOperation_t op_b = lb.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = la.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int m = as_int(N, "N"), n = as_int(M, "M"), k = as_int(K, "K");
  const int ldb = as_int(lb.ld, "leading dim"), lda = as_int(la.ld, "leading dim");
  const int ldc = m;
  if constexpr (std::is_same_v<T, float>) {
    PIPIT_CUBLAS_CHECK("matmul", cublasSgemmStridedBatched(handle, op_b, op_a, m, n, k, &alpha, b,
                                                           ldb, stride_b, a, lda, stride_a, &beta,
                                                           c, ldc, M * N, as_int(batch, "batch")));
  } else {
    PIPIT_CUBLAS_CHECK("matmul", cublasDgemmStridedBatched(handle, op_b, op_a, m, n, k, &alpha, b,
                                                           ldb, stride_b, a, lda, stride_a, &beta,
                                                           c, ldc, M * N, as_int(batch, "batch")));
  }
}

template <typename T>
void matmul_typed(int device, const Tensor& a_in, const Tensor& b_in, const Tensor& out,
                  bool accumulate) {
  const Tensor a = gemm_ready(a_in), b = gemm_ready(b_in);
  const MatrixLayout la = layout_of(a), lb = layout_of(b);
  const int64_t r = out.dim();
  const int64_t M = out.shape()[r - 2], N = out.shape()[r - 1], K = a.shape()[r - 1];
  if (M == 0 || N == 0) return;
  if (K == 0) {
    if (!accumulate) backend(out).fill(out, 0.0);
    return;
  }
  int64_t batch = 1;
  for (int64_t d = 0; d < r - 2; ++d) batch *= out.shape()[d];
  const int64_t stride_a = batch_stride(a), stride_b = batch_stride(b);
  const T beta = accumulate ? T(1) : T(0);
  Blas& h = blas(device);
  std::lock_guard<std::mutex> lock(h.mutex);
  if (batch > 1 && stride_b == 0 && batch_folds_into_rows(a, la)) {
    gemm<T>(h.handle, la, lb, M * batch, N, K, a.data<T>(), 0, b.data<T>(), 0, beta, out.data<T>(),
            1);
    return;
  }
  gemm<T>(h.handle, la, lb, M, N, K, a.data<T>(), stride_a, b.data<T>(), stride_b, beta,
          out.data<T>(), batch);
}

}  // namespace

std::shared_ptr<Storage> CudaBackend::allocate(size_t nbytes) {
  return cuda::allocate(index_, nbytes);
}

void CudaBackend::matmul(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate) {
  cuda::DeviceGuard guard(index_);
  PIPIT_CHECK(out.is_contiguous(), "matmul: output must be contiguous");
  switch (a.dtype()) {
    case DType::f32:
      return matmul_typed<float>(index_, a, b, out, accumulate);
    case DType::f64:
      return matmul_typed<double>(index_, a, b, out, accumulate);
    default:
      throw Error(
          detail::concat("matmul: dtype ", a.dtype(), " is not supported (expected F32 or F64)"));
  }
}

}  // namespace pipit
