#include "autograd/conv.h"

#include <limits>

#include "autograd/elementwise.h"
#include "autograd/function.h"
#include "autograd/matmul.h"
#include "autograd/reduce.h"
#include "autograd/shape_ops.h"
#include "tensor/factory.h"
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

Window make_window(const char* op, const Tensor& x, Size2 kernel, Size2 stride, Size2 padding,
                   Size2 dilation) {
  PIPIT_CHECK(x.dim() == 4, op, ": input must be [N, C, H, W], got ", shape_str(x.shape()));
  PIPIT_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::f64, op,
              ": needs an F32 or F64 input, got ", x.dtype());
  PIPIT_CHECK(x.device().is_cpu(), op, ": runs on the CPU only for now, got ", x.device().str());
  PIPIT_CHECK(kernel.h > 0 && kernel.w > 0 && stride.h > 0 && stride.w > 0 && dilation.h > 0 &&
                  dilation.w > 0 && padding.h >= 0 && padding.w >= 0,
              op, ": kernel (", kernel.h, ", ", kernel.w, "), stride (", stride.h, ", ", stride.w,
              ") and dilation (", dilation.h, ", ", dilation.w, ") must be positive and padding (",
              padding.h, ", ", padding.w, ") non-negative");
  Window g{x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3], kernel.h,   kernel.w, stride.h,
           stride.w,     padding.h,    padding.w,    dilation.h,   dilation.w, 0,        0};
  const int64_t span_h = g.H + 2 * g.ph - g.dh * (g.kh - 1) - 1;
  const int64_t span_w = g.W + 2 * g.pw - g.dw * (g.kw - 1) - 1;
  PIPIT_CHECK(span_h >= 0 && span_w >= 0, op, ": kernel (", g.kh, ", ", g.kw, ") with dilation (",
              g.dh, ", ", g.dw, ") does not fit input ", shape_str(x.shape()), " padded by (", g.ph,
              ", ", g.pw, ")");
  g.OH = span_h / g.sh + 1;
  g.OW = span_w / g.sw + 1;
  return g;
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
#pragma omp parallel for schedule(static) if (planes * work_per_plane > kParallelGrain)
  for (int64_t p = 0; p < planes; ++p) f(p);
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
  Tensor input = x.contiguous();
  Tensor col = Tensor::empty({g.N, g.C * g.taps(), g.outputs()}, x.dtype(), x.device());
  dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    im2col_kernel(input.data<T>(), col.data<T>(), g);
  });
  return col;
}

Tensor col2im(const Tensor& col, const Window& g) {
  Tensor input = col.contiguous();
  Tensor x = Tensor::empty({g.N, g.C, g.H, g.W}, col.dtype(), col.device());
  dispatch(col.dtype(), [&](auto t) {
    using T = decltype(t);
    col2im_kernel(input.data<T>(), x.data<T>(), g);
  });
  return x;
}

struct Conv2dBackward : Node {
  Tensor x, weight;
  Window window{};
  std::vector<Tensor> apply(const Tensor& grad) override {
    const Window& g = window;
    const int64_t O = weight.shape()[0];
    Tensor g3 = reshape(grad.contiguous(), {g.N, O, g.outputs()});
    Tensor w2 = reshape(weight, {O, -1});
    Tensor gx, gw, gb;
    if (next[0]) gx = col2im(matmul(transpose(w2, 0, 1), g3), g);
    if (next[1]) {
      Tensor per_sample = matmul(g3, transpose(im2col(x, g), 1, 2));
      gw = reshape(sum(per_sample, {0}), weight.shape());
    }
    if (next.size() == 2) return {gx, gw};
    if (next[2]) gb = sum(g3, {0, 2});
    return {gx, gw, gb};
  }
  std::string name() const override { return "Conv2dBackward"; }
};

// Max pooling keeps, per output, the in-plane offset of its first maximum for the backward.
template <typename T>
void max_pool_kernel(const T* x, T* out, int64_t* argmax, const Window& g) {
  for_planes(g, g.taps() * g.outputs(), [&](int64_t p) {
    const T* plane = x + p * g.H * g.W;
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        T best = -std::numeric_limits<T>::infinity();
        int64_t best_at = -1;
        for (int64_t i = 0; i < g.kh; ++i) {
          const int64_t h = oh * g.sh - g.ph + i * g.dh;
          if (h < 0 || h >= g.H) continue;
          for (int64_t j = 0; j < g.kw; ++j) {
            const int64_t w = ow * g.sw - g.pw + j * g.dw;
            if (w < 0 || w >= g.W) continue;
            const T v = plane[h * g.W + w];
            // NaN wins, as in PyTorch, so that it propagates instead of vanishing.
            if (best_at < 0 || v > best || (v != v && best == best)) {
              best = v;
              best_at = h * g.W + w;
            }
          }
        }
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

// avg_pool2d forward (backward = false: x -> out) and its adjoint (backward = true: the
// output gradient spread back over each window).
template <typename T>
void avg_pool_kernel(const T* in, T* out, const Window& g, bool backward) {
  const T scale = T(1) / static_cast<T>(g.taps());
  for_planes(g, g.taps() * g.outputs(), [&](int64_t p) {
    const T* src = in + p * (backward ? g.outputs() : g.H * g.W);
    T* dst = out + p * (backward ? g.H * g.W : g.outputs());
    if (backward) {
      for (int64_t k = 0; k < g.H * g.W; ++k) dst[k] = T(0);
    }
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        T total = T(0);
        const T share = backward ? src[oh * g.OW + ow] * scale : T(0);
        for (int64_t i = 0; i < g.kh; ++i) {
          const int64_t h = oh * g.sh - g.ph + i * g.dh;
          if (h < 0 || h >= g.H) continue;
          for (int64_t j = 0; j < g.kw; ++j) {
            const int64_t w = ow * g.sw - g.pw + j * g.dw;
            if (w < 0 || w >= g.W) continue;
            if (backward) {
              dst[h * g.W + w] += share;
            } else {
              total += src[h * g.W + w];
            }
          }
        }
        if (!backward) dst[oh * g.OW + ow] = total * scale;
      }
    }
  });
}

struct MaxPool2dBackward : Node {
  Tensor argmax;
  Window window{};
  std::vector<Tensor> apply(const Tensor& grad) override {
    Tensor g = grad.contiguous();
    Tensor gx = Tensor::empty({window.N, window.C, window.H, window.W}, g.dtype(), g.device());
    dispatch(g.dtype(), [&](auto t) {
      using T = decltype(t);
      max_pool_backward_kernel(g.data<T>(), argmax.data<int64_t>(), gx.data<T>(), window);
    });
    return {gx};
  }
  std::string name() const override { return "MaxPool2dBackward"; }
};

struct AvgPool2dBackward : Node {
  Window window{};
  std::vector<Tensor> apply(const Tensor& grad) override {
    Tensor g = grad.contiguous();
    Tensor gx = Tensor::empty({window.N, window.C, window.H, window.W}, g.dtype(), g.device());
    dispatch(g.dtype(), [&](auto t) {
      using T = decltype(t);
      avg_pool_kernel(g.data<T>(), gx.data<T>(), window, true);
    });
    return {gx};
  }
  std::string name() const override { return "AvgPool2dBackward"; }
};

Window pool_window(const char* op, const Tensor& x, Size2 kernel, Size2 stride, Size2 padding) {
  Window g = make_window(op, x, kernel, stride, padding, 1);
  // PyTorch's limit: wider padding would let a window see padding only.
  PIPIT_CHECK(2 * g.ph <= g.kh && 2 * g.pw <= g.kw, op, ": padding (", g.ph, ", ", g.pw,
              ") must be at most half the kernel (", g.kh, ", ", g.kw, ")");
  return g;
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Size2 stride,
              Size2 padding, Size2 dilation) {
  PIPIT_CHECK(weight.dim() == 4, "conv2d: weight must be [O, C, kh, kw], got ",
              shape_str(weight.shape()));
  const Window g = make_window("conv2d", x, Size2(weight.shape()[2], weight.shape()[3]), stride,
                               padding, dilation);
  const int64_t O = weight.shape()[0];
  PIPIT_CHECK(weight.shape()[1] == g.C, "conv2d: input of shape ", shape_str(x.shape()),
              " does not match weight of shape ", shape_str(weight.shape()), " (channels ", g.C,
              " vs ", weight.shape()[1], ")");
  PIPIT_CHECK(x.dtype() == weight.dtype(), "conv2d: input dtype ", x.dtype(),
              " differs from weight dtype ", weight.dtype());
  if (bias.defined()) {
    PIPIT_CHECK(bias.shape() == Shape{O}, "conv2d: bias of shape ", shape_str(bias.shape()),
                " does not match weight of shape ", shape_str(weight.shape()));
    PIPIT_CHECK(bias.dtype() == x.dtype(), "conv2d: bias dtype ", bias.dtype(),
                " differs from input dtype ", x.dtype());
  }
  Tensor out;
  {
    NoGradGuard no_grad;
    Tensor y = matmul(reshape(weight, {O, -1}), im2col(x, g));
    if (bias.defined()) y = y + reshape(bias, {O, 1});
    out = reshape(y, {g.N, O, g.OH, g.OW});
  }
  auto node = bias.defined() ? detail::make_node<Conv2dBackward>(out, {x, weight, bias})
                             : detail::make_node<Conv2dBackward>(out, {x, weight});
  if (node) {
    node->x = x.detach();
    node->weight = weight.detach();
    node->window = g;
  }
  return out;
}

Tensor max_pool2d(const Tensor& x, Size2 kernel, Size2 stride, Size2 padding) {
  const Window g = pool_window("max_pool2d", x, kernel, stride, padding);
  Tensor input = x.detach().contiguous();
  Tensor out = Tensor::empty({g.N, g.C, g.OH, g.OW}, x.dtype(), x.device());
  Tensor argmax = Tensor::empty(out.shape(), DType::i64, x.device());
  dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    max_pool_kernel(input.data<T>(), out.data<T>(), argmax.data<int64_t>(), g);
  });
  if (auto node = detail::make_node<MaxPool2dBackward>(out, {x})) {
    node->argmax = argmax;
    node->window = g;
  }
  return out;
}

Tensor avg_pool2d(const Tensor& x, Size2 kernel, Size2 stride, Size2 padding) {
  const Window g = pool_window("avg_pool2d", x, kernel, stride, padding);
  Tensor input = x.detach().contiguous();
  Tensor out = Tensor::empty({g.N, g.C, g.OH, g.OW}, x.dtype(), x.device());
  dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    avg_pool_kernel(input.data<T>(), out.data<T>(), g, false);
  });
  if (auto node = detail::make_node<AvgPool2dBackward>(out, {x})) node->window = g;
  return out;
}

}  // namespace pipit
