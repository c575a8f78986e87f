// The fused nn kernels on CUDA: softmax, embedding and cross-entropy (layer norm is in
// layer_norm.cu). Every sum is taken in a fixed order (per-thread strides, then a fixed tree, or
// the indices' order for embedding gradients), so results do not change between runs.
#include <cmath>
#include <cub/device/device_radix_sort.cuh>
#include <limits>
#include <vector>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/index_check.h"
#include "tensor/kernel_layout.h"

namespace pipit {
namespace cuda {
namespace nn {

template <typename T>
__device__ compute_t<T> row_max(const T* row, int64_t C) {
  using A = compute_t<T>;
  A m = -A(INFINITY);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const A v = widen(row[c]);
    m = v > m ? v : m;
  }
  return block_max(m);
}

template <typename T>
__global__ void softmax_kernel(const T* x, T* y, int64_t rows, int64_t C, bool log) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * C;
    T* yr = y + r * C;
    const T mx = row_max(xr, C);
    T s = T(0);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += exp_(xr[c] - mx);
    const T sum = block_sum(s);
    if (log) {
      const T lse = mx + log_(sum);
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) yr[c] = xr[c] - lse;
    } else {
      const T inv = T(1) / sum;
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) yr[c] = exp_(xr[c] - mx) * inv;
    }
  }
}

template <typename T>
__global__ void softmax_backward_kernel(const T* g, const T* y, T* gx, int64_t rows, int64_t C,
                                        bool log) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* gr = g + r * C;
    const T* yr = y + r * C;
    T* out = gx + r * C;
    T s = T(0);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += log ? gr[c] : gr[c] * yr[c];
    const T dot = block_sum(s);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      out[c] = log ? gr[c] - exp_(yr[c]) * dot : yr[c] * (gr[c] - dot);
    }
  }
}

// Runs a row kernel on contiguous rows along `dim`, copying in and out only when needed.
template <typename Kernel>
void along_dim(const std::vector<Tensor>& inputs, const Tensor& out, int64_t dim, Kernel kernel) {
  std::vector<Tensor> rows;
  for (const Tensor& t : inputs) rows.push_back(dense(dim_last(t, dim)));
  Tensor out_view = dim_last(out, dim);
  Tensor out_rows = out_view.is_contiguous()
                        ? out_view
                        : Tensor::empty(out_view.shape(), out.dtype(), out.device());
  const int64_t C = out.shape()[dim];
  if (out.numel() > 0) kernel(rows, out_rows, out.numel() / C, C);
  if (!out_rows.same_storage(out)) backend(out).copy(out_rows, out_view);
}

// Cross-entropy reads each row of logits in one pass with an online softmax (a running max
// and the sum of exp(x - max), rescaled when the max grows), 16 bytes per load from the row's
// first 16-byte boundary on: one-element loads of bf16 left too few bytes in flight to use the
// memory system (an H200 read GPT-2's [8192, 50304] logits at 0.6 TB/s). Half logits are summed
// in f32 (A).
constexpr int kVectorBytes = 16;

// Elements of `row` before its first 16-byte boundary (all C if it has none).
template <typename T>
__device__ __forceinline__ int64_t unaligned_head(const T* row, int64_t C) {
  const auto address = reinterpret_cast<uintptr_t>(row);
  if (address % sizeof(T) != 0) return C;
  return min(
      C, static_cast<int64_t>((kVectorBytes - address % kVectorBytes) % kVectorBytes / sizeof(T)));
}

// f(c, x[c]) for the elements of `row` this thread owns, in an order fixed by C and the row's
// address: the head one at a time, then 16-byte vectors strided over the block, then the rest.
template <typename T, typename F>
__device__ __forceinline__ void for_each_in_row(const T* row, int64_t C, F f) {
  constexpr int kPer = kVectorBytes / sizeof(T);
  const int64_t head = unaligned_head(row, C), vectors = (C - head) / kPer;
  for (int64_t c = threadIdx.x; c < head; c += blockDim.x) f(c, row[c]);
  const Pack<T, kPer>* row16 = reinterpret_cast<const Pack<T, kPer>*>(row + head);
  for (int64_t j = threadIdx.x; j < vectors; j += blockDim.x) {
    const Pack<T, kPer> x = row16[j];
#pragma unroll
    for (int k = 0; k < kPer; ++k) f(head + j * kPer + k, x.v[k]);
  }
  for (int64_t c = head + vectors * kPer + threadIdx.x; c < C; c += blockDim.x) f(c, row[c]);
}

// out[c] = f(c, x[c]) over a row, 16 bytes per load and store where the two rows share their
// alignment, else one element at a time.
template <typename T, typename F>
__device__ __forceinline__ void map_row(const T* row, T* out, int64_t C, F f) {
  constexpr int kPer = kVectorBytes / sizeof(T);
  const bool together = reinterpret_cast<uintptr_t>(row) % kVectorBytes ==
                        reinterpret_cast<uintptr_t>(out) % kVectorBytes;
  const int64_t head = together ? unaligned_head(row, C) : C;
  const int64_t vectors = (C - head) / kPer;
  for (int64_t c = threadIdx.x; c < head; c += blockDim.x) out[c] = f(c, row[c]);
  const Pack<T, kPer>* row16 = reinterpret_cast<const Pack<T, kPer>*>(row + head);
  Pack<T, kPer>* out16 = reinterpret_cast<Pack<T, kPer>*>(out + head);
  for (int64_t j = threadIdx.x; j < vectors; j += blockDim.x) {
    const Pack<T, kPer> x = row16[j];
    Pack<T, kPer> y;
#pragma unroll
    for (int k = 0; k < kPer; ++k) y.v[k] = f(head + j * kPer + k, x.v[k]);
    out16[j] = y;
  }
  for (int64_t c = head + vectors * kPer + threadIdx.x; c < C; c += blockDim.x) {
    out[c] = f(c, row[c]);
  }
}

// The row's max and sum of exp(x - max) over the block, every thread getting both.
template <typename T>
__device__ void row_softmax_sums(const T* row, int64_t C, compute_t<T>& max, compute_t<T>& sum) {
  using A = compute_t<T>;
  A m = -A(INFINITY), s = A(0);
  for_each_in_row(row, C, [&](int64_t, T x) {
    const A v = widen(x);
    if (v > m) {
      s = s * exp_(m - v) + A(1);
      m = v;
    } else if (!(v == -A(INFINITY))) {  // -inf adds nothing; NaN carries through
      s += exp_(v - m);
    }
  });
  max = block_max(m);
  sum = block_sum(s * exp_(m - max));
}

template <typename T>
__global__ void cross_entropy_kernel(const T* x, int64_t ld, const int64_t* t, int64_t N, int64_t C,
                                     int64_t ignore, compute_t<T>* loss, compute_t<T>* stats) {
  using A = compute_t<T>;
  for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
    if (t[i] == ignore) {  // the same for the whole block, so barriers stay uniform
      if (threadIdx.x == 0) {
        loss[i] = A(0);
        if (stats) stats[2 * i] = stats[2 * i + 1] = A(0);
      }
      continue;
    }
    const T* row = x + i * ld;
    A mx, sum;
    row_softmax_sums(row, C, mx, sum);
    // A target out of range (check_indices raises it at the next read-back) gives NaN.
    if (threadIdx.x == 0) {
      loss[i] = t[i] >= 0 && t[i] < C ? mx + log_(sum) - widen(row[t[i]]) : A(NAN);
      if (stats) {
        stats[2 * i] = mx;
        stats[2 * i + 1] = sum;
      }
    }
  }
}

// With the forward's stats (the same block size and row give the same max and sum bits) the
// row is read once, not twice: a third of the pass's traffic over a GPT-2 vocabulary.
template <typename T>
__global__ void cross_entropy_backward_kernel(const T* x, int64_t ld, const int64_t* t, int64_t N,
                                              int64_t C, int64_t ignore,
                                              const compute_t<T>* scale_on_device,
                                              const compute_t<T>* stats, T* g, int64_t ldg) {
  using A = compute_t<T>;
  const A scale = *scale_on_device;
  for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
    T* gr = g + i * ldg;
    const T* row = x + i * ld;
    if (t[i] == ignore) {
      map_row(row, gr, C, [](int64_t, T) { return round_to<T>(A(0)); });
      continue;
    }
    A mx, sum;
    if (stats) {
      mx = stats[2 * i];
      sum = stats[2 * i + 1];
    } else {
      row_softmax_sums(row, C, mx, sum);
    }
    const A inv = scale / sum;
    const int64_t target = t[i];
    map_row(row, gr, C, [&](int64_t c, T v) {
      return round_to<T>(exp_(widen(v) - mx) * inv - (c == target ? scale : A(0)));
    });
  }
}

// grad_weight[row] += the rows of g at `positions`, for each run of equal `sorted` indices:
// the block at a run's first entry adds the run in order, the others do nothing.
template <typename T>
__global__ void embedding_backward_kernel(const int64_t* sorted, const int64_t* positions,
                                          int64_t n, int64_t V, int64_t C, const T* g,
                                          T* grad_weight) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int64_t row = sorted[i];
    // Out-of-range rows were raised by the forward's check; they must not be written.
    if (row < 0 || row >= V || (i > 0 && sorted[i - 1] == row)) continue;
    int64_t end = i + 1;
    while (end < n && sorted[end] == row) ++end;
    T* out = grad_weight + row * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      T sum = out[c];
      for (int64_t j = i; j < end; ++j) sum += g[positions[j] * C + c];
      out[c] = sum;
    }
  }
}

void check_targets(const Tensor& targets, int64_t C, int64_t ignore_index) {
  check_indices({"cross_entropy", "target", "row", C, "classes"}, targets, ignore_index);
}

}  // namespace nn
}  // namespace cuda

using namespace cuda::nn;
using cuda::DeviceGuard;
using cuda::ptr;
using cuda::row_threads;
using cuda::rows_grid;

void CudaBackend::softmax(const Tensor& in, int64_t dim, bool log, const Tensor& out) {
  DeviceGuard guard(index_);
  PIPIT_DISPATCH_FLOAT(in.dtype(), "softmax", {
    along_dim({in}, out, dim, [&](auto& rows, const Tensor& o, int64_t R, int64_t C) {
      softmax_kernel<scalar_t><<<rows_grid(R), row_threads(C), 0, cuda::stream()>>>(
          ptr<scalar_t>(rows[0]), ptr<scalar_t>(o), R, C, log);
      PIPIT_CUDA_CHECK_LAUNCH("softmax");
    });
  });
}

void CudaBackend::softmax_backward(const Tensor& grad, const Tensor& out, int64_t dim, bool log,
                                   const Tensor& grad_in) {
  DeviceGuard guard(index_);
  PIPIT_DISPATCH_FLOAT(out.dtype(), "softmax_backward", {
    along_dim({grad, out}, grad_in, dim, [&](auto& rows, const Tensor& o, int64_t R, int64_t C) {
      softmax_backward_kernel<scalar_t><<<rows_grid(R), row_threads(C), 0, cuda::stream()>>>(
          ptr<scalar_t>(rows[0]), ptr<scalar_t>(rows[1]), ptr<scalar_t>(o), R, C, log);
      PIPIT_CUDA_CHECK_LAUNCH("softmax_backward");
    });
  });
}

void CudaBackend::embedding(const Tensor& weight_in, const Tensor& indices_in, const Tensor& out) {
  DeviceGuard guard(index_);
  PIPIT_CHECK(out.is_contiguous(), "embedding: output must be contiguous");
  Tensor indices = dense(indices_in), weight = dense(weight_in);
  const int64_t V = weight.shape()[0], C = weight.shape()[1];
  cuda::check_indices({"embedding", "index", "position", V, "rows"}, indices);
  const int64_t* idx = indices.data<int64_t>();
  PIPIT_CUDA_DISPATCH_ALL(weight.dtype(), "embedding", {
    const scalar_t* w = ptr<scalar_t>(weight);
    scalar_t* o = ptr<scalar_t>(out);
    cuda::for_each("embedding", out.numel(), [=] __device__(int64_t i) {
      const int64_t row = idx[i / C];  // out-of-range rows read as 0 until the check raises
      o[i] = row >= 0 && row < V ? w[row * C + i % C] : scalar_t(0);
    });
  });
}

void CudaBackend::embedding_backward(const Tensor& grad_in, const Tensor& indices_in,
                                     const Tensor& grad_weight) {
  DeviceGuard guard(index_);
  PIPIT_DISPATCH_FLOAT(grad_weight.dtype(), "embedding_backward", {
    using T = scalar_t;
    Tensor indices = dense(indices_in), g = dense(grad_in);
    const int64_t n = indices.numel(), V = grad_weight.shape()[0], C = grad_weight.shape()[1];
    if (n == 0) return;
    PIPIT_CHECK(n <= std::numeric_limits<int>::max(), "embedding_backward: ", n,
                " indices is more than one sort takes");
    // Atomics would add a row's gradients in whatever order they land, so training would not
    // repeat bit for bit. Instead: the positions sorted by index (a stable radix sort keeps
    // equal indices in position order), then each run of equal indices summed in that order,
    // the order the CPU adds them in.
    const Device device = grad_weight.device();
    Tensor positions = Tensor::empty({n}, DType::i64, device);
    Tensor sorted_indices = Tensor::empty({n}, DType::i64, device);
    Tensor sorted_positions = Tensor::empty({n}, DType::i64, device);
    int64_t* pos = ptr<int64_t>(positions);
    cuda::for_each("embedding_backward", n, [=] __device__(int64_t i) { pos[i] = i; });
    int key_bits = 1;
    while (key_bits < 63 && (int64_t{1} << key_bits) < V) ++key_bits;
    size_t scratch_bytes = 0;
    const int items = static_cast<int>(n);
    PIPIT_CUDA_CHECK("embedding_backward",
                     cub::DeviceRadixSort::SortPairs(nullptr, scratch_bytes, ptr<int64_t>(indices),
                                                     ptr<int64_t>(sorted_indices), pos,
                                                     ptr<int64_t>(sorted_positions), items, 0,
                                                     key_bits, cuda::stream()));
    Tensor scratch = Tensor::empty({static_cast<int64_t>(scratch_bytes)}, DType::b8, device);
    PIPIT_CUDA_CHECK(
        "embedding_backward",
        cub::DeviceRadixSort::SortPairs(
            scratch.raw_data(), scratch_bytes, ptr<int64_t>(indices), ptr<int64_t>(sorted_indices),
            pos, ptr<int64_t>(sorted_positions), items, 0, key_bits, cuda::stream()));
    embedding_backward_kernel<T><<<rows_grid(n), row_threads(C), 0, cuda::stream()>>>(
        ptr<int64_t>(sorted_indices), ptr<int64_t>(sorted_positions), n, V, C, ptr<T>(g),
        grad_weight.data<T>());
    PIPIT_CUDA_CHECK_LAUNCH("embedding_backward");
  });
}

void CudaBackend::cross_entropy(const Tensor& logits_in, const Tensor& targets_in,
                                int64_t ignore_index, const Tensor& losses, const Tensor& stats) {
  DeviceGuard guard(index_);
  check_cross_entropy_stats("cross_entropy", stats, logits_in);
  PIPIT_CUDA_DISPATCH_FLOAT_AND_HALF(logits_in.dtype(), "cross_entropy", {
    using T = scalar_t;
    using A = cuda::compute_t<T>;
    Tensor logits = unit_stride_rows(logits_in), targets = dense(targets_in);
    const int64_t N = logits.shape()[0], C = logits.shape()[1];
    check_targets(targets, C, ignore_index);
    if (N == 0) break;
    cross_entropy_kernel<T><<<rows_grid(N), row_threads(C), 0, cuda::stream()>>>(
        ptr<T>(logits), logits.strides()[0], targets.data<int64_t>(), N, C, ignore_index,
        ptr<A>(losses), stats.defined() ? ptr<A>(stats) : nullptr);
    PIPIT_CUDA_CHECK_LAUNCH("cross_entropy");
  });
}

void CudaBackend::cross_entropy_backward(const Tensor& logits_in, const Tensor& targets_in,
                                         int64_t ignore_index, const Tensor& scale,
                                         const Tensor& stats, const Tensor& grad_logits) {
  DeviceGuard guard(index_);
  check_cross_entropy_stats("cross_entropy_backward", stats, logits_in);
  PIPIT_CUDA_DISPATCH_FLOAT_AND_HALF(logits_in.dtype(), "cross_entropy_backward", {
    using T = scalar_t;
    using A = cuda::compute_t<T>;
    Tensor logits = unit_stride_rows(logits_in), targets = dense(targets_in);
    const int64_t N = logits.shape()[0], C = logits.shape()[1];
    check_cross_entropy_scale("cross_entropy_backward", scale, logits);
    check_targets(targets, C, ignore_index);
    PIPIT_CHECK(grad_logits.strides()[1] == 1,
                "cross_entropy_backward: the gradient's rows need unit stride");
    if (N == 0) break;
    cross_entropy_backward_kernel<T><<<rows_grid(N), row_threads(C), 0, cuda::stream()>>>(
        ptr<T>(logits), logits.strides()[0], targets.data<int64_t>(), N, C, ignore_index,
        ptr<A>(scale), stats.defined() ? ptr<A>(stats) : nullptr, ptr<T>(grad_logits),
        grad_logits.strides()[0]);
    PIPIT_CUDA_CHECK_LAUNCH("cross_entropy_backward");
  });
}

}  // namespace pipit
