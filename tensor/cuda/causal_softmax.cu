// Causal attention weights on CUDA (Backend::causal_softmax): scale, causal mask and softmax in
// one pass that reads only each row's visible keys, where scale, mask and softmax as separate
// ops make three passes over the whole [T, T] scores and write two more tensors of that size.
// Sums are taken in a fixed order (per-thread, then a fixed tree), so results repeat exactly.
#include <cmath>

#include "tensor/cuda/common.cuh"

namespace pipit {
namespace cuda {
namespace {

// Rows of up to kItems * kMaxThreads keys stay in registers and are read once; longer rows
// are read again from memory (L2) for each pass.
constexpr int kItems = 8;
constexpr int kMaxThreads = 128;

// Row r of [..., T, T] scores is query r % T, which sees keys 0..r % T.
__device__ __forceinline__ int64_t visible_keys(int64_t row, int64_t C) {
  return row % C + 1;
}

template <typename T>
__global__ void causal_softmax_kernel(const T* x, T* y, int64_t rows, int64_t C, T scale) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t visible = visible_keys(r, C);
    const T* xr = x + r * C;
    T* yr = y + r * C;
    T v[kItems];
    T mx = -T(INFINITY);
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t c = threadIdx.x + int64_t{k} * blockDim.x;
      v[k] = c < visible ? xr[c] * scale : -T(INFINITY);
      mx = v[k] > mx ? v[k] : mx;
    }
    mx = block_max(mx);
    T s = T(0);
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t c = threadIdx.x + int64_t{k} * blockDim.x;
      v[k] = c < visible ? exp_(v[k] - mx) : T(0);
      s += v[k];
    }
    const T inv = T(1) / block_sum(s);
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t c = threadIdx.x + int64_t{k} * blockDim.x;
      if (c < C) yr[c] = v[k] * inv;
    }
  }
}

template <typename T>
__global__ void causal_softmax_long_kernel(const T* x, T* y, int64_t rows, int64_t C, T scale) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t visible = visible_keys(r, C);
    const T* xr = x + r * C;
    T* yr = y + r * C;
    T mx = -T(INFINITY);
    for (int64_t c = threadIdx.x; c < visible; c += blockDim.x) {
      mx = xr[c] * scale > mx ? xr[c] * scale : mx;
    }
    mx = block_max(mx);
    T s = T(0);
    for (int64_t c = threadIdx.x; c < visible; c += blockDim.x) s += exp_(xr[c] * scale - mx);
    const T inv = T(1) / block_sum(s);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      yr[c] = c < visible ? exp_(xr[c] * scale - mx) * inv : T(0);
    }
  }
}

template <typename T>
__global__ void causal_softmax_backward_kernel(const T* g, const T* y, T* gx, int64_t rows,
                                               int64_t C, T scale) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t visible = visible_keys(r, C);
    const T* gr = g + r * C;
    const T* yr = y + r * C;
    T* out = gx + r * C;
    T gv[kItems], yv[kItems];
    T s = T(0);
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t c = threadIdx.x + int64_t{k} * blockDim.x;
      gv[k] = c < visible ? gr[c] : T(0);
      yv[k] = c < visible ? yr[c] : T(0);
      s += gv[k] * yv[k];
    }
    const T dot = block_sum(s);
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t c = threadIdx.x + int64_t{k} * blockDim.x;
      if (c < C) out[c] = c < visible ? yv[k] * (gv[k] - dot) * scale : T(0);
    }
  }
}

template <typename T>
__global__ void causal_softmax_backward_long_kernel(const T* g, const T* y, T* gx, int64_t rows,
                                                    int64_t C, T scale) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t visible = visible_keys(r, C);
    const T* gr = g + r * C;
    const T* yr = y + r * C;
    T* out = gx + r * C;
    T s = T(0);
    for (int64_t c = threadIdx.x; c < visible; c += blockDim.x) s += gr[c] * yr[c];
    const T dot = block_sum(s);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      out[c] = c < visible ? yr[c] * (gr[c] - dot) * scale : T(0);
    }
  }
}

// Launches the register kernel where a row fits kItems keys per thread, else the long one.
template <typename Short, typename Long, typename... Args>
void launch_rows(const char* op, int64_t rows, int64_t C, Short short_kernel, Long long_kernel,
                 Args... args) {
  if (rows == 0) return;
  if (C <= int64_t{kItems} * kMaxThreads) {
    const int threads = std::max(32, static_cast<int>((C + kItems - 1) / kItems + 31) / 32 * 32);
    short_kernel<<<rows_grid(rows), threads, 0, stream()>>>(args...);
  } else {
    long_kernel<<<rows_grid(rows), row_threads(C), 0, stream()>>>(args...);
  }
  PIPIT_CUDA_CHECK_LAUNCH(op);
}

}  // namespace
}  // namespace cuda

using cuda::DeviceGuard;
using cuda::ptr;

void CudaBackend::causal_softmax(const Tensor& scores, double scale, const Tensor& out) {
  DeviceGuard guard(index_);
  check_causal_softmax("causal_softmax", scores, out);
  PIPIT_DISPATCH_FLOAT(scores.dtype(), "causal_softmax", {
    using T = scalar_t;
    const Tensor x = dense(scores);
    const int64_t C = x.shape()[x.dim() - 1];
    const int64_t rows = C == 0 ? 0 : x.numel() / C;
    cuda::launch_rows("causal_softmax", rows, C, cuda::causal_softmax_kernel<T>,
                      cuda::causal_softmax_long_kernel<T>, ptr<T>(x), ptr<T>(out), rows, C,
                      static_cast<T>(scale));
  });
}

void CudaBackend::causal_softmax_backward(const Tensor& grad, const Tensor& out, double scale,
                                          const Tensor& grad_scores) {
  DeviceGuard guard(index_);
  check_causal_softmax("causal_softmax_backward", out, grad_scores);
  PIPIT_DISPATCH_FLOAT(out.dtype(), "causal_softmax_backward", {
    using T = scalar_t;
    const Tensor g = dense(grad), y = dense(out);
    const int64_t C = y.shape()[y.dim() - 1];
    const int64_t rows = C == 0 ? 0 : y.numel() / C;
    cuda::launch_rows("causal_softmax_backward", rows, C, cuda::causal_softmax_backward_kernel<T>,
                      cuda::causal_softmax_backward_long_kernel<T>, ptr<T>(g), ptr<T>(y),
                      ptr<T>(grad_scores), rows, C, static_cast<T>(scale));
  });
}

}  // namespace pipit
