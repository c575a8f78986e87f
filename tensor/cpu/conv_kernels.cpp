// Convolution as im2col + GEMM, and max/average pooling, on the CPU.
#include <algorithm>
#include <limits>

#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/loop.h"
#include "tensor/kernel_layout.h"
#include "tensor/parallel.h"

namespace pipit {
namespace {

// One sliding-window layout, shared by the convolution and the pools. Kernels below run over
// whole (n, c) planes so that each thread writes only its own plane: the scatters of the
// backward passes then need no atomics and sum in a fixed order.
struct Window {
  int64_t N, C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW;
  int64_t planes() const { return N * C; }
  int64_t taps() const { return kh * kw; }
  int64_t outputs() const { return OH * OW; }
};

// `image` is [N, C, H, W] (the input or its gradient), `result` [N, *, OH, OW].
Window make_window(const Tensor& image, const Tensor& result, int64_t kh, int64_t kw, int64_t sh,
                   int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw) {
  const Shape &x = image.shape(), &y = result.shape();
  return {x[0], x[1], x[2], x[3], kh, kw, sh, sw, ph, pw, dh, dw, y[2], y[3]};
}

Window conv_window(const Tensor& image, const Tensor& weight, const Tensor& result,
                   const Conv2dGeometry& g) {
  return make_window(image, result, weight.shape()[2], weight.shape()[3], g.stride_h, g.stride_w,
                     g.pad_h, g.pad_w, g.dilation_h, g.dilation_w);
}

Window pool_window(const Tensor& image, const Tensor& result, const Pool2dGeometry& g) {
  return make_window(image, result, g.kernel_h, g.kernel_w, g.stride_h, g.stride_w, g.pad_h,
                     g.pad_w, 1, 1);
}

// Outputs are written through raw pointers in row-major order.
void check_contiguous(const char* op, const Tensor& out) {
  PIPIT_CHECK(out.is_contiguous(), op, ": output must be contiguous");
}

// A view of contiguous t with the given geometry.
Tensor strided(const Tensor& t, Shape shape, Shape strides) {
  return Tensor::from_storage(t.storage(), std::move(shape), std::move(strides), t.offset(),
                              t.dtype());
}

template <typename F>
void dispatch(DType dtype, F&& f) {
  if (dtype == DType::f32) {
    f(float{});
  } else {
    f(double{});
  }
}

// Calls f(plane) for every (n, c) plane, across threads when the work is large enough.
template <typename F>
void for_planes(const Window& g, int64_t work_per_plane, F&& f) {
  const int64_t planes = g.planes();
  const int threads = planes * work_per_plane > kParallelGrain
                          ? static_cast<int>(std::min<int64_t>(get_num_threads(), planes))
                          : 1;
  cpu::parallel_range(planes, threads, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) f(p);
  });
}

// col [N, C * kh * kw, OH * OW]: row (c, i, j) holds the input tap (i, j) of channel c under
// every output position, zero where it falls into the padding.
template <typename T>
void im2col_kernel(const T* x, T* col, const Window& g) {
  const int64_t L = g.outputs();
  for_planes(g, g.taps() * L, [&](int64_t p) {
    const T* plane = x + p * g.H * g.W;
    T* rows = col + p * g.taps() * L;
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        T* row = rows + (i * g.kw + j) * L;
        for (int64_t oh = 0; oh < g.OH; ++oh) {
          const int64_t h = oh * g.sh - g.ph + i * g.dh;
          for (int64_t ow = 0; ow < g.OW; ++ow) {
            const int64_t w = ow * g.sw - g.pw + j * g.dw;
            const bool inside = h >= 0 && h < g.H && w >= 0 && w < g.W;
            row[oh * g.OW + ow] = inside ? plane[h * g.W + w] : T(0);
          }
        }
      }
    }
  });
}

// The adjoint of im2col: every column entry is added back onto the input element it came from.
template <typename T>
void col2im_kernel(const T* col, T* x, const Window& g) {
  const int64_t L = g.outputs();
  for_planes(g, g.taps() * L, [&](int64_t p) {
    T* plane = x + p * g.H * g.W;
    const T* rows = col + p * g.taps() * L;
    for (int64_t k = 0; k < g.H * g.W; ++k) plane[k] = T(0);
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        const T* row = rows + (i * g.kw + j) * L;
        for (int64_t oh = 0; oh < g.OH; ++oh) {
          const int64_t h = oh * g.sh - g.ph + i * g.dh;
          if (h < 0 || h >= g.H) continue;
          for (int64_t ow = 0; ow < g.OW; ++ow) {
            const int64_t w = ow * g.sw - g.pw + j * g.dw;
            if (w >= 0 && w < g.W) plane[h * g.W + w] += row[oh * g.OW + ow];
          }
        }
      }
    }
  });
}

Tensor im2col(const Tensor& x, const Window& g) {
  Tensor input = dense(x);
  Tensor col = Tensor::empty({g.N, g.C * g.taps(), g.outputs()}, x.dtype(), x.device());
  dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    im2col_kernel(input.data<T>(), col.data<T>(), g);
  });
  return col;
}

// Calls f(offset in the plane) for every tap of output (oh, ow)'s window that lies inside the
// plane, row by row.
template <typename F>
void for_taps(const Window& g, int64_t oh, int64_t ow, F&& f) {
  for (int64_t i = 0; i < g.kh; ++i) {
    const int64_t h = oh * g.sh - g.ph + i * g.dh;
    if (h < 0 || h >= g.H) continue;
    for (int64_t j = 0; j < g.kw; ++j) {
      const int64_t w = ow * g.sw - g.pw + j * g.dw;
      if (w >= 0 && w < g.W) f(h * g.W + w);
    }
  }
}

// Max pooling keeps, per output, the in-plane offset of its first maximum for the backward.
template <typename T>
void max_pool_kernel(const T* x, T* out, int64_t* argmax, const Window& g) {
  for_planes(g, g.taps() * g.outputs(), [&](int64_t p) {
    const T* plane = x + p * g.H * g.W;
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        T best = -std::numeric_limits<T>::infinity();
        int64_t best_at = -1;
        for_taps(g, oh, ow, [&](int64_t at) {
          const T v = plane[at];
          // NaN wins, as in PyTorch, so that it propagates instead of vanishing.
          if (best_at < 0 || v > best || (v != v && best == best)) {
            best = v;
            best_at = at;
          }
        });
        const int64_t o = p * g.outputs() + oh * g.OW + ow;
        out[o] = best;
        argmax[o] = best_at;
      }
    }
  });
}

template <typename T>
void max_pool_backward_kernel(const T* grad, const int64_t* argmax, T* gx, const Window& g) {
  for_planes(g, g.outputs(), [&](int64_t p) {
    T* plane = gx + p * g.H * g.W;
    for (int64_t k = 0; k < g.H * g.W; ++k) plane[k] = T(0);
    for (int64_t o = p * g.outputs(); o < (p + 1) * g.outputs(); ++o) plane[argmax[o]] += grad[o];
  });
}

// Padding counts in the mean, so every window divides by kh * kw.
template <typename T>
void avg_pool_kernel(const T* x, T* out, const Window& g) {
  const T scale = T(1) / static_cast<T>(g.taps());
  for_planes(g, g.taps() * g.outputs(), [&](int64_t p) {
    const T* plane = x + p * g.H * g.W;
    T* result = out + p * g.outputs();
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        T total = T(0);
        for_taps(g, oh, ow, [&](int64_t at) { total += plane[at]; });
        result[oh * g.OW + ow] = total * scale;
      }
    }
  });
}

// The adjoint: each output's gradient spread evenly over its window.
template <typename T>
void avg_pool_backward_kernel(const T* grad, T* gx, const Window& g) {
  const T scale = T(1) / static_cast<T>(g.taps());
  for_planes(g, g.taps() * g.outputs(), [&](int64_t p) {
    const T* result_grad = grad + p * g.outputs();
    T* plane = gx + p * g.H * g.W;
    for (int64_t k = 0; k < g.H * g.W; ++k) plane[k] = T(0);
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        const T share = result_grad[oh * g.OW + ow] * scale;
        for_taps(g, oh, ow, [&](int64_t at) { plane[at] += share; });
      }
    }
  });
}

}  // namespace

// out [N, O, L] = weight [O, C * kh * kw] (broadcast over N) @ col [N, C * kh * kw, L].
void CpuBackend::conv2d(const Tensor& x, const Tensor& weight, const Conv2dGeometry& geometry,
                        const Tensor& out) {
  check_contiguous("conv2d", out);
  const Window g = conv_window(x, weight, out, geometry);
  const int64_t O = weight.shape()[0], CK = g.C * g.taps(), L = g.outputs();
  const Tensor w = dense(weight);
  matmul(strided(w, {g.N, O, CK}, {0, CK, 1}), im2col(x, g),
         strided(out, {g.N, O, L}, {O * L, L, 1}), false);
}

// grad_x = col2im(weight^T @ grad_out): the adjoint of the forward.
void CpuBackend::conv2d_backward_input(const Tensor& grad_out, const Tensor& weight,
                                       const Conv2dGeometry& geometry, const Tensor& grad_x) {
  check_contiguous("conv2d_backward_input", grad_x);
  const Window g = conv_window(grad_x, weight, grad_out, geometry);
  const int64_t O = weight.shape()[0], CK = g.C * g.taps(), L = g.outputs();
  const Tensor w = dense(weight), grad = dense(grad_out);
  Tensor col = Tensor::empty({g.N, CK, L}, grad.dtype(), grad.device());
  matmul(strided(w, {g.N, CK, O}, {0, 1, CK}), strided(grad, {g.N, O, L}, {O * L, L, 1}), col,
         false);
  dispatch(col.dtype(), [&](auto t) {
    using T = decltype(t);
    col2im_kernel(col.data<T>(), grad_x.data<T>(), g);
  });
}

// grad_weight = sum over the batch of grad_out [O, L] @ col^T [L, C * kh * kw].
void CpuBackend::conv2d_backward_weight(const Tensor& grad_out, const Tensor& x,
                                        const Conv2dGeometry& geometry, const Tensor& grad_weight) {
  check_contiguous("conv2d_backward_weight", grad_weight);
  const Window g = conv_window(x, grad_weight, grad_out, geometry);
  const int64_t O = grad_weight.shape()[0], CK = g.C * g.taps(), L = g.outputs();
  const Tensor grad = dense(grad_out), col = im2col(x, g);
  Tensor per_sample = Tensor::empty({g.N, O, CK}, grad.dtype(), grad.device());
  matmul(strided(grad, {g.N, O, L}, {O * L, L, 1}), strided(col, {g.N, L, CK}, {CK * L, 1, L}),
         per_sample, false);
  const int64_t batch_dim[] = {0};
  reduce(ReduceOp::sum, per_sample, batch_dim, strided(grad_weight, {1, O, CK}, {O * CK, CK, 1}));
}

void CpuBackend::max_pool2d(const Tensor& x, const Pool2dGeometry& window, const Tensor& out,
                            const Tensor& argmax) {
  check_contiguous("max_pool2d", out);
  check_contiguous("max_pool2d", argmax);
  const Window g = pool_window(x, out, window);
  const Tensor input = dense(x);
  dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    max_pool_kernel(input.data<T>(), out.data<T>(), argmax.data<int64_t>(), g);
  });
}

void CpuBackend::max_pool2d_backward(const Tensor& grad_out, const Tensor& argmax,
                                     const Pool2dGeometry& window, const Tensor& grad_x) {
  check_contiguous("max_pool2d_backward", grad_x);
  const Window g = pool_window(grad_x, grad_out, window);
  const Tensor grad = dense(grad_out), indices = dense(argmax);
  dispatch(grad.dtype(), [&](auto t) {
    using T = decltype(t);
    max_pool_backward_kernel(grad.data<T>(), indices.data<int64_t>(), grad_x.data<T>(), g);
  });
}

void CpuBackend::avg_pool2d(const Tensor& x, const Pool2dGeometry& window, const Tensor& out) {
  check_contiguous("avg_pool2d", out);
  const Window g = pool_window(x, out, window);
  const Tensor input = dense(x);
  dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    avg_pool_kernel(input.data<T>(), out.data<T>(), g);
  });
}

void CpuBackend::avg_pool2d_backward(const Tensor& grad_out, const Pool2dGeometry& window,
                                     const Tensor& grad_x) {
  check_contiguous("avg_pool2d_backward", grad_x);
  const Window g = pool_window(grad_x, grad_out, window);
  const Tensor grad = dense(grad_out);
  dispatch(grad.dtype(), [&](auto t) {
    using T = decltype(t);
    avg_pool_backward_kernel(grad.data<T>(), grad_x.data<T>(), g);
  });
}

}  // namespace pipit
