#pragma once
// Internal helpers for CPU kernels: dtype dispatch and a strided N-operand loop that merges
// dims contiguous for every operand and splits the work across threads.
#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include "tensor/cpu/thread_team.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/dtype.h"
#include "tensor/dtype_dispatch.h"
#include "tensor/parallel.h"
#include "tensor/tensor.h"

namespace pipit::cpu {

struct Half {
  uint16_t bits;
  Half() = default;
  Half(double v) : bits(float_to_half(static_cast<float>(v))) {}
  operator double() const { return half_to_float(bits); }
};
struct BFloat16 {
  uint16_t bits;
  BFloat16() = default;
  BFloat16(double v) : bits(float_to_bfloat16(static_cast<float>(v))) {}
  operator double() const { return bfloat16_to_float(bits); }
};

// The type kernels compute in for elements of type T: f32 for the half types (the only
// two-byte element types that are not integers), T otherwise.
template <typename T>
using compute_t = std::conditional_t<sizeof(T) == 2 && !std::is_integral_v<T>, float, T>;

#define PIPIT_DISPATCH_FLOAT_AND_HALF(dtype, op, ...)                                     \
  PIPIT_DISPATCH_FLOAT_AND_HALF_AS(::pipit::cpu::Half, ::pipit::cpu::BFloat16, dtype, op, \
                                   __VA_ARGS__)
#define PIPIT_DISPATCH_NUMERIC_AND_HALF(dtype, op, ...)                                     \
  PIPIT_DISPATCH_NUMERIC_AND_HALF_AS(::pipit::cpu::Half, ::pipit::cpu::BFloat16, dtype, op, \
                                     __VA_ARGS__)
#define PIPIT_DISPATCH_ALL(dtype, op, ...) \
  PIPIT_DISPATCH_ALL_AS(::pipit::cpu::Half, ::pipit::cpu::BFloat16, dtype, op, __VA_ARGS__)

// Threads to use for a loop over n elements of unit cost.
inline int threads_for(int64_t n) {
  return n < kParallelGrain
             ? 1
             : static_cast<int>(std::min<int64_t>(get_num_threads(), n / (kParallelGrain / 4)));
}

// Runs body(begin, end) over [0, n) split into contiguous ranges, one per thread.
template <typename Body>
void parallel_range(int64_t n, int threads, Body&& body) {
  if (threads <= 1 || n <= 1) {
    if (n > 0) body(int64_t{0}, n);
    return;
  }
  run_on_team(threads, [&](int t, int nt) {
    const int64_t chunk = (n + nt - 1) / nt;
    const int64_t begin = std::min<int64_t>(n, chunk * t);
    const int64_t end = std::min<int64_t>(n, begin + chunk);
    if (begin < end) body(begin, end);
  });
}

// Geometry of an N-operand elementwise loop after merging dims.
template <int N>
struct Loop {
  Shape shape;
  std::array<Shape, N> strides;
};

template <int N>
Loop<N> make_loop(const Shape& shape, const std::array<const Tensor*, N>& operands) {
  Loop<N> loop;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !loop.shape.empty();
    for (int k = 0; k < N && merge; ++k) {
      merge = loop.strides[k].back() == operands[k]->strides()[d] * shape[d];
    }
    if (merge) {
      loop.shape.back() *= shape[d];
      for (int k = 0; k < N; ++k) loop.strides[k].back() = operands[k]->strides()[d];
    } else {
      loop.shape.push_back(shape[d]);
      for (int k = 0; k < N; ++k) loop.strides[k].push_back(operands[k]->strides()[d]);
    }
  }
  if (loop.shape.empty()) {
    loop.shape.push_back(1);
    for (int k = 0; k < N; ++k) loop.strides[k].push_back(0);
  }
  return loop;
}

// Calls row(base pointers, count, inner strides) over every run of the innermost merged dim.
// `elements` are byte pointers to element [0...0] of each operand; sizes are element sizes.
template <int N, typename Row>
void for_each_row(const Loop<N>& loop, std::array<char*, N> base, std::array<int64_t, N> elsize,
                  Row&& row) {
  const int64_t rank = static_cast<int64_t>(loop.shape.size());
  const int64_t inner = loop.shape.back();
  const int64_t total = shape_numel(loop.shape);
  std::array<int64_t, N> inner_stride;
  for (int k = 0; k < N; ++k) inner_stride[k] = loop.strides[k].back();
  parallel_range(total, threads_for(total), [&](int64_t begin, int64_t end) {
    Shape index(rank);
    int64_t rem = begin;
    for (int64_t d = rank - 1; d >= 0; --d) {
      index[d] = rem % loop.shape[d];
      rem /= loop.shape[d];
    }
    int64_t pos = begin;
    while (pos < end) {
      std::array<char*, N> ptr;
      for (int k = 0; k < N; ++k) {
        int64_t off = 0;
        for (int64_t d = 0; d < rank; ++d) off += index[d] * loop.strides[k][d];
        ptr[k] = base[k] + off * elsize[k];
      }
      int64_t count = std::min(end - pos, inner - index[rank - 1]);
      row(ptr, count, inner_stride);
      pos += count;
      index[rank - 1] += count;
      for (int64_t d = rank - 1; d > 0 && index[d] == loop.shape[d]; --d) {
        index[d] = 0;
        ++index[d - 1];
      }
    }
  });
}

// Half tensors reach the f32 kernels widened (exactly) and leave them rounded once, as the
// CUDA kernels compute on them in f32 registers.
// t as f32: a copy for a half tensor (with t's strides when t's elements fill a block of its
// storage in any order, a transposed view's for one), t itself otherwise.
Tensor widened(const Tensor& t);
// out = wide, rounded to out's dtype.
void copy_rounded(const Tensor& wide, const Tensor& out);
// Runs kernel(target) where target is `out`, or for a half `out` an f32 stand-in whose
// values are then rounded into out.
template <typename Kernel>
void into_f32(const Tensor& out, Kernel kernel) {
  if (!is_half(out.dtype())) return kernel(out);
  Tensor wide = Tensor::empty(out.shape(), DType::f32);
  kernel(wide);
  copy_rounded(wide, out);
}

// n half elements (every `stride`-th) widened into f32, and f32 values rounded into them: bf16
// runs of unit stride through the vectorized row kernels, the rest element by element.
template <typename H>
void widen_run(const H* x, int64_t stride, compute_t<H>* out, int64_t n) {
  if constexpr (std::is_same_v<H, BFloat16>) {
    if (stride == 1) return widen_bf16_row(&x->bits, out, n);
  }
  for (int64_t i = 0; i < n; ++i) out[i] = compute_t<H>(x[i * stride]);
}
template <typename H>
void round_run(const compute_t<H>* x, H* out, int64_t stride, int64_t n) {
  if constexpr (std::is_same_v<H, BFloat16>) {
    if (stride == 1) return round_bf16_row(x, &out->bits, n);
  }
  for (int64_t i = 0; i < n; ++i) out[i * stride] = H(x[i]);
}

inline char* byte_ptr(const Tensor& t) {
  return static_cast<char*>(t.raw_data());
}

}  // namespace pipit::cpu
