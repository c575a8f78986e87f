#pragma once
// Internal helpers for the CUDA kernels: dtype dispatch, strided indexing, launches and block
// reductions. Included only by tensor/cuda/*.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include "tensor/cuda/cuda_backend.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/cuda_device.h"
#include "tensor/dtype_dispatch.h"
#include "tensor/kernel_layout.h"

namespace pipit::cuda {

#define PIPIT_CUDA_DISPATCH_FLOAT_AND_HALF(dtype, op, ...) \
  PIPIT_DISPATCH_FLOAT_AND_HALF_AS(__half, __nv_bfloat16, dtype, op, __VA_ARGS__)
#define PIPIT_CUDA_DISPATCH_NUMERIC_AND_HALF(dtype, op, ...) \
  PIPIT_DISPATCH_NUMERIC_AND_HALF_AS(__half, __nv_bfloat16, dtype, op, __VA_ARGS__)
#define PIPIT_CUDA_DISPATCH_ALL(dtype, op, ...) \
  PIPIT_DISPATCH_ALL_AS(__half, __nv_bfloat16, dtype, op, __VA_ARGS__)

constexpr int kThreads = 256;

// The stream kernels of the calling thread go to on the current device.
inline cudaStream_t stream() {
  return static_cast<cudaStream_t>(current_stream_handle(current_device()));
}
// Merged dims an elementwise operand may have; real tensors merge to far fewer.
constexpr int kMaxDims = 12;

template <typename T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

// Element offsets of N operands sharing one iteration shape, row-major.
template <int N>
struct Indexer {
  int rank = 0;
  bool contiguous = false;  // one dim, unit stride for every operand: offsets equal the index
  int64_t sizes[kMaxDims];
  int64_t strides[N][kMaxDims];

  __device__ void offsets(int64_t i, int64_t (&off)[N]) const {
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t pos = i % sizes[d];
      i /= sizes[d];
      for (int k = 0; k < N; ++k) off[k] += pos * strides[k][d];
    }
  }
};

// Merges dims that are contiguous for every operand (as the CPU loop does), so most
// elementwise ops index one or two dims.
template <int N>
Indexer<N> make_indexer(const char* op, const Shape& shape,
                        const std::array<const Tensor*, N>& operands) {
  Indexer<N> ix;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = ix.rank > 0;
    for (int k = 0; k < N && merge; ++k) {
      merge = ix.strides[k][ix.rank - 1] == operands[k]->strides()[d] * shape[d];
    }
    if (merge) {
      ix.sizes[ix.rank - 1] *= shape[d];
      for (int k = 0; k < N; ++k) ix.strides[k][ix.rank - 1] = operands[k]->strides()[d];
      continue;
    }
    PIPIT_CHECK(ix.rank < kMaxDims, op, ": shape ", shape_str(shape), " merges into more than ",
                kMaxDims, " strided dims");
    ix.sizes[ix.rank] = shape[d];
    for (int k = 0; k < N; ++k) ix.strides[k][ix.rank] = operands[k]->strides()[d];
    ++ix.rank;
  }
  if (ix.rank == 0) {
    ix.rank = 1;
    ix.sizes[0] = 1;
    for (int k = 0; k < N; ++k) ix.strides[k][0] = 1;
  }
  ix.contiguous = ix.rank == 1;
  for (int k = 0; k < N; ++k) ix.contiguous = ix.contiguous && ix.strides[k][0] == 1;
  return ix;
}

template <typename F>
__global__ void for_each_kernel(int64_t n, F f) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    f(i);
  }
}

// Runs f(i) for i in [0, n) on the current device, a grid-stride loop so any n fits a grid.
template <typename F>
void for_each(const char* op, int64_t n, F f) {
  if (n <= 0) return;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t{1} << 16);
  for_each_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream()>>>(n, f);
  PIPIT_CUDA_CHECK_LAUNCH(op);
}

// Calls f(offsets) for every element of an N-operand strided iteration.
template <int N, typename F>
void for_each_strided(const char* op, const Shape& shape,
                      const std::array<const Tensor*, N>& operands, F f) {
  const Indexer<N> ix = make_indexer<N>(op, shape, operands);
  const int64_t n = shape_numel(shape);
  if (ix.contiguous) {
    for_each(op, n, [=] __device__(int64_t i) {
      int64_t off[N];
      for (int k = 0; k < N; ++k) off[k] = i;
      f(off);
    });
  } else {
    for_each(op, n, [=] __device__(int64_t i) {
      int64_t off[N];
      ix.offsets(i, off);
      f(off);
    });
  }
}

// Conversions through double, as the CPU backend converts; half types round to nearest even.
template <typename T>
__device__ __forceinline__ double to_double(T x) {
  if constexpr (std::is_same_v<T, __half>) {
    return static_cast<double>(__half2float(x));
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return static_cast<double>(__bfloat162float(x));
  } else {
    return static_cast<double>(x);
  }
}

template <typename T>
__device__ __forceinline__ T from_double(double v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v != 0.0;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

// The type kernels compute in for elements of type T: f32 for the half types (the only
// two-byte element types that are not integers), T otherwise, as the CPU backend computes.
template <typename T>
using compute_t = std::conditional_t<sizeof(T) == 2 && !std::is_integral_v<T>, float, T>;

// x in its compute type (exact).
template <typename T>
__device__ __forceinline__ compute_t<T> widen(T x) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(x);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(x);
  } else {
    return x;
  }
}

// v rounded to T (to nearest even for the half types).
template <typename T>
__device__ __forceinline__ T round_to(compute_t<T> v) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(v);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else {
    return static_cast<T>(v);
  }
}

// f applied in the compute type to elements of T: widened in, rounded once out.
template <typename T, typename F>
struct InCompute {
  F f;
  __device__ T operator()(T x) const { return round_to<T>(f(widen(x))); }
  __device__ T operator()(T x, T y) const { return round_to<T>(f(widen(x), widen(y))); }
};

// expf/logf for float, the double versions otherwise.
template <typename T>
__device__ __forceinline__ T exp_(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return expf(x);
  } else {
    return exp(x);
  }
}

template <typename T>
__device__ __forceinline__ T log_(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return logf(x);
  } else {
    return log(x);
  }
}

// W elements of T moved together: one 16-byte load or store when W * sizeof(T) is 16.
template <typename T, int W>
struct alignas(sizeof(T) * W) Pack {
  T v[W];
};

// Sum of v over the warp, in a fixed tree; every lane gets it.
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
template <typename T>
__device__ T block_sum(T v) {
  __shared__ T warp_sums[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  __syncthreads();  // warp_sums may still be read by a previous call
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  T total = T(0);
  for (int w = 0; w < warps; ++w) total += warp_sums[w];
  return total;
}

template <typename T>
__device__ T block_max(T v) {
  __shared__ T warp_max[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int o = 16; o > 0; o /= 2) {
    const T other = __shfl_xor_sync(0xffffffffu, v, o);
    v = other > v ? other : v;
  }
  __syncthreads();
  if (lane == 0) warp_max[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  T total = warp_max[0];
  for (int w = 1; w < warps; ++w) total = warp_max[w] > total ? warp_max[w] : total;
  return total;
}

// Row kernels run one block per row: at most 65535 blocks, which loop over the rest.
inline int rows_grid(int64_t rows) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(rows, 65535)));
}

// Threads per row for a row kernel: a warp multiple, no more than the row needs.
inline int row_threads(int64_t C) {
  return static_cast<int>(std::min<int64_t>(kThreads, std::max<int64_t>(32, (C + 31) / 32 * 32)));
}

}  // namespace pipit::cuda
