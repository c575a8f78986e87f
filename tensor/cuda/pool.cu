// Max and average pooling on CUDA: one thread per output in the forward passes, one per input
// element in the backward passes. The backward passes gather rather than scatter: each input
// element walks the outputs whose windows cover it, in increasing output order, and sums their
// gradients. That needs no atomics where windows overlap, gives the same bits on every run, and
// adds in the CPU's order (its per-plane scatter also visits outputs in increasing order).
#include <cmath>

#include "tensor/cuda/common.cuh"

namespace pipit {
namespace cuda {
namespace pool {

// Shapes of one pooling call, passed to the kernels by value.
struct Geometry {
  int64_t H, W, OH, OW, kh, kw, sh, sw, ph, pw;
};

Geometry geometry(const Tensor& image, const Tensor& result, const Pool2dGeometry& g) {
  const Shape &x = image.shape(), &y = result.shape();
  return {x[2], x[3], y[2], y[3], g.kernel_h, g.kernel_w, g.stride_h, g.stride_w, g.pad_h, g.pad_w};
}

void check_output(const char* op, const Tensor& out) {
  PIPIT_CHECK(out.is_contiguous(), op, ": output must be contiguous");
}

// Calls f(offset in the plane) for every tap of output (oh, ow)'s window that lies inside the
// plane, row by row.
template <typename F>
__device__ __forceinline__ void for_taps(const Geometry& g, int64_t oh, int64_t ow, F f) {
  for (int64_t r = 0; r < g.kh; ++r) {
    const int64_t h = oh * g.sh - g.ph + r;
    if (h < 0 || h >= g.H) continue;
    for (int64_t c = 0; c < g.kw; ++c) {
      const int64_t w = ow * g.sw - g.pw + c;
      if (w >= 0 && w < g.W) f(h * g.W + w);
    }
  }
}

// The outputs [lo, hi] along one dim whose windows cover input position i.
struct Range {
  int64_t lo, hi;
};

__device__ __forceinline__ Range covering(int64_t i, int64_t pad, int64_t kernel, int64_t stride,
                                          int64_t outputs) {
  const int64_t first = i + pad - kernel + 1;  // the earliest window start that still covers i
  const int64_t lo = first <= 0 ? 0 : (first + stride - 1) / stride;
  const int64_t last = (i + pad) / stride;
  return {lo, last < outputs ? last : outputs - 1};
}

// Calls f(offset in the output plane) for every output whose window covers input (h, w), in
// increasing order.
template <typename F>
__device__ __forceinline__ void for_covering(const Geometry& g, int64_t h, int64_t w, F f) {
  const Range rows = covering(h, g.ph, g.kh, g.sh, g.OH);
  const Range cols = covering(w, g.pw, g.kw, g.sw, g.OW);
  for (int64_t oh = rows.lo; oh <= rows.hi; ++oh) {
    for (int64_t ow = cols.lo; ow <= cols.hi; ++ow) f(oh * g.OW + ow);
  }
}

// A product rounded on its own, never fused into the following add, as the CPU computes it.
template <typename T>
__device__ __forceinline__ T mul_rn(T a, T b) {
  if constexpr (std::is_same_v<T, float>) {
    return __fmul_rn(a, b);
  } else {
    return __dmul_rn(a, b);
  }
}

template <typename T>
void max_forward(const Tensor& x, const Tensor& out, const Tensor& argmax, const Geometry& g) {
  const T* in = ptr<T>(x);
  T* o = ptr<T>(out);
  int64_t* best_at = ptr<int64_t>(argmax);
  for_each("max_pool2d", out.numel(), [=] __device__(int64_t i) {
    const int64_t ow = i % g.OW, oh = (i / g.OW) % g.OH, plane = i / (g.OW * g.OH);
    const T* p = in + plane * g.H * g.W;
    T best = -INFINITY;
    int64_t best_offset = -1;
    for_taps(g, oh, ow, [&](int64_t at) {
      const T v = p[at];
      // NaN wins, as on the CPU, so that it propagates instead of vanishing.
      if (best_offset < 0 || v > best || (v != v && best == best)) {
        best = v;
        best_offset = at;
      }
    });
    o[i] = best;
    best_at[i] = best_offset;
  });
}

// grad_x[i] = the sum of term(o, offset of i in its plane) over the outputs o (indices into
// grad_out) whose windows cover input element i, in increasing order.
template <typename T, typename Term>
void gather(const char* op, const Tensor& grad_x, const Geometry& g, Term term) {
  T* gx = ptr<T>(grad_x);
  for_each(op, grad_x.numel(), [=] __device__(int64_t i) {
    const int64_t w = i % g.W, h = (i / g.W) % g.H, base = i / (g.W * g.H) * g.OH * g.OW;
    T total = T(0);
    for_covering(g, h, w, [&](int64_t o) { total += term(base + o, h * g.W + w); });
    gx[i] = total;
  });
}

// Adding the zeros of the outputs whose maximum lies elsewhere leaves the sum exact.
template <typename T>
void max_backward(const Tensor& grad_out, const Tensor& argmax, const Tensor& grad_x,
                  const Geometry& g) {
  const T* grad = ptr<T>(grad_out);
  const int64_t* best_at = ptr<int64_t>(argmax);
  gather<T>("max_pool2d_backward", grad_x, g, [=] __device__(int64_t o, int64_t here) {
    return best_at[o] == here ? grad[o] : T(0);
  });
}

// Padding counts in the mean (count_include_pad), so every window divides by kh * kw.
template <typename T>
void avg_forward(const Tensor& x, const Tensor& out, const Geometry& g) {
  const T* in = ptr<T>(x);
  T* o = ptr<T>(out);
  const T scale = T(1) / static_cast<T>(g.kh * g.kw);
  for_each("avg_pool2d", out.numel(), [=] __device__(int64_t i) {
    const int64_t ow = i % g.OW, oh = (i / g.OW) % g.OH, plane = i / (g.OW * g.OH);
    const T* p = in + plane * g.H * g.W;
    T total = T(0);
    for_taps(g, oh, ow, [&](int64_t at) { total += p[at]; });
    o[i] = total * scale;
  });
}

template <typename T>
void avg_backward(const Tensor& grad_out, const Tensor& grad_x, const Geometry& g) {
  const T* grad = ptr<T>(grad_out);
  const T scale = T(1) / static_cast<T>(g.kh * g.kw);
  gather<T>("avg_pool2d_backward", grad_x, g,
            [=] __device__(int64_t o, int64_t) { return mul_rn(grad[o], scale); });
}

}  // namespace pool
}  // namespace cuda

using cuda::DeviceGuard;

void CudaBackend::max_pool2d(const Tensor& x, const Pool2dGeometry& window, const Tensor& out,
                             const Tensor& argmax) {
  DeviceGuard guard(index_);
  cuda::pool::check_output("max_pool2d", out);
  cuda::pool::check_output("max_pool2d", argmax);
  const Tensor input = dense(x);
  const cuda::pool::Geometry g = cuda::pool::geometry(x, out, window);
  PIPIT_DISPATCH_FLOAT(x.dtype(), "max_pool2d",
                       cuda::pool::max_forward<scalar_t>(input, out, argmax, g));
}

void CudaBackend::max_pool2d_backward(const Tensor& grad_out, const Tensor& argmax,
                                      const Pool2dGeometry& window, const Tensor& grad_x) {
  DeviceGuard guard(index_);
  cuda::pool::check_output("max_pool2d_backward", grad_x);
  PIPIT_CHECK(argmax.dtype() == DType::i64, "max_pool2d_backward: argmax must be I64, got ",
              argmax.dtype());
  const Tensor grad = dense(grad_out), indices = dense(argmax);
  const cuda::pool::Geometry g = cuda::pool::geometry(grad_x, grad_out, window);
  PIPIT_DISPATCH_FLOAT(grad.dtype(), "max_pool2d_backward",
                       cuda::pool::max_backward<scalar_t>(grad, indices, grad_x, g));
}

void CudaBackend::avg_pool2d(const Tensor& x, const Pool2dGeometry& window, const Tensor& out) {
  DeviceGuard guard(index_);
  cuda::pool::check_output("avg_pool2d", out);
  const Tensor input = dense(x);
  const cuda::pool::Geometry g = cuda::pool::geometry(x, out, window);
  PIPIT_DISPATCH_FLOAT(x.dtype(), "avg_pool2d", cuda::pool::avg_forward<scalar_t>(input, out, g));
}

void CudaBackend::avg_pool2d_backward(const Tensor& grad_out, const Pool2dGeometry& window,
                                      const Tensor& grad_x) {
  DeviceGuard guard(index_);
  cuda::pool::check_output("avg_pool2d_backward", grad_x);
  const Tensor grad = dense(grad_out);
  const cuda::pool::Geometry g = cuda::pool::geometry(grad_x, grad_out, window);
  PIPIT_DISPATCH_FLOAT(grad.dtype(), "avg_pool2d_backward",
                       cuda::pool::avg_backward<scalar_t>(grad, grad_x, g));
}

}  // namespace pipit
