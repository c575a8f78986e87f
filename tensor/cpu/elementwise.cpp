// Elementwise kernels: unary, binary (broadcast inputs arrive as expanded views), where.
#include <cmath>

#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/loop.h"
#include "tensor/cpu/vec_math.h"

namespace pipit {
namespace {

using cpu::byte_ptr;
using cpu::compute_t;

// map1 and map2 apply f elementwise; a row kernel, when given, takes over contiguous runs.
// Half elements are computed on in f32: each run passes through f32 buffers a chunk at a
// time, through the row kernel, so the bits are those of the f32 kernel on the widened
// tensors, rounded once, without widened copies of whole operands.
struct NoRowKernel {};

template <typename S>
constexpr bool is_half_element = !std::is_same_v<compute_t<S>, S>;
constexpr int64_t kHalfChunk = 256;

template <typename F, typename Row, typename T, typename... In>
void apply_row(F& f, Row& row, T* out, int64_t n, const In*... in) {
  if constexpr (std::is_same_v<Row, NoRowKernel>) {
    for (int64_t i = 0; i < n; ++i) out[i] = f(in[i]...);
  } else {
    row(in..., out, n);
  }
}

template <typename O, typename I, typename F, typename Row = NoRowKernel>
void map1(const Tensor& in, const Tensor& out, F f, Row row = {}) {
  auto loop = cpu::make_loop<2>(out.shape(), {&out, &in});
  cpu::for_each_row<2>(loop, {byte_ptr(out), byte_ptr(in)}, {sizeof(O), sizeof(I)},
                       [&](auto p, int64_t n, auto s) {
                         O* o = reinterpret_cast<O*>(p[0]);
                         const I* x = reinterpret_cast<const I*>(p[1]);
                         if constexpr (is_half_element<I>) {
                           compute_t<I> xs[kHalfChunk];
                           compute_t<O> ys[kHalfChunk];
                           for (int64_t begin = 0; begin < n; begin += kHalfChunk) {
                             const int64_t m = std::min(kHalfChunk, n - begin);
                             cpu::widen_run(x + begin * s[1], s[1], xs, m);
                             apply_row(f, row, ys, m, xs);
                             cpu::round_run(ys, o + begin * s[0], s[0], m);
                           }
                         } else if (s[0] == 1 && s[1] == 1) {
                           apply_row(f, row, o, n, x);
                         } else {
                           for (int64_t i = 0; i < n; ++i) o[i * s[0]] = f(x[i * s[1]]);
                         }
                       });
}

template <typename O, typename T, typename F, typename Row = NoRowKernel>
void map2(const Tensor& a, const Tensor& b, const Tensor& out, F f, Row row = {}) {
  auto loop = cpu::make_loop<3>(out.shape(), {&out, &a, &b});
  cpu::for_each_row<3>(loop, {byte_ptr(out), byte_ptr(a), byte_ptr(b)},
                       {sizeof(O), sizeof(T), sizeof(T)}, [&](auto p, int64_t n, auto s) {
                         O* o = reinterpret_cast<O*>(p[0]);
                         const T* x = reinterpret_cast<const T*>(p[1]);
                         const T* y = reinterpret_cast<const T*>(p[2]);
                         if constexpr (is_half_element<T>) {
                           compute_t<T> xs[kHalfChunk], ys[kHalfChunk];
                           compute_t<O> zs[kHalfChunk];
                           for (int64_t begin = 0; begin < n; begin += kHalfChunk) {
                             const int64_t m = std::min(kHalfChunk, n - begin);
                             cpu::widen_run(x + begin * s[1], s[1], xs, m);
                             cpu::widen_run(y + begin * s[2], s[2], ys, m);
                             apply_row(f, row, zs, m, xs, ys);
                             cpu::round_run(zs, o + begin * s[0], s[0], m);
                           }
                         } else if (s[0] == 1 && s[1] == 1 && s[2] == 1) {
                           apply_row(f, row, o, n, x, y);
                         } else if (s[0] == 1 && s[1] == 1 && s[2] == 0) {
                           const T yv = *y;
                           for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], yv);
                         } else {
                           for (int64_t i = 0; i < n; ++i)
                             o[i * s[0]] = f(x[i * s[1]], y[i * s[2]]);
                         }
                       });
}

// bf16 GELU and its gradient by table (vec_math.h): the computed path's bits, without its
// arithmetic, which made GELU the costliest elementwise op of a bf16 GPT step.
void gelu_bf16(const Tensor& in, const Tensor& out) {
  const uint16_t* table = cpu::bf16_gelu_table();
  auto loop = cpu::make_loop<2>(out.shape(), {&out, &in});
  cpu::for_each_row<2>(loop, {byte_ptr(out), byte_ptr(in)}, {2, 2}, [&](auto p, int64_t n, auto s) {
    auto* y = reinterpret_cast<uint16_t*>(p[0]);
    const auto* x = reinterpret_cast<const uint16_t*>(p[1]);
    if (s[0] == 1 && s[1] == 1) return cpu::gelu_bf16_row(table, x, y, n);
    for (int64_t i = 0; i < n; ++i) y[i * s[0]] = table[x[i * s[1]]];
  });
}

void gelu_backward_bf16(const Tensor& grad, const Tensor& x, const Tensor& out) {
  const float* derivative = cpu::bf16_gelu_derivative_table();
  auto loop = cpu::make_loop<3>(out.shape(), {&out, &grad, &x});
  cpu::for_each_row<3>(loop, {byte_ptr(out), byte_ptr(grad), byte_ptr(x)}, {2, 2, 2},
                       [&](auto p, int64_t n, auto s) {
                         auto* y = reinterpret_cast<uint16_t*>(p[0]);
                         const auto* g = reinterpret_cast<const uint16_t*>(p[1]);
                         const auto* at = reinterpret_cast<const uint16_t*>(p[2]);
                         if (s[0] == 1 && s[1] == 1 && s[2] == 1) {
                           return cpu::gelu_backward_bf16_row(derivative, g, at, y, n);
                         }
                         for (int64_t i = 0; i < n; ++i) {
                           y[i * s[0]] = float_to_bfloat16(bfloat16_to_float(g[i * s[1]]) *
                                                           derivative[at[i * s[2]]]);
                         }
                       });
}

template <typename S>
void unary_typed(UnaryOp op, const Tensor& in, const Tensor& out) {
  using T = compute_t<S>;
  switch (op) {
    case UnaryOp::neg:
      return map1<S, S>(in, out, [](T x) { return T(-x); });
    case UnaryOp::abs:
      return map1<S, S>(in, out, [](T x) { return T(x < 0 ? -x : x); });
    case UnaryOp::relu:
      return map1<S, S>(in, out, [](T x) { return T(x > 0 ? x : 0); });
    default:
      break;
  }
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case UnaryOp::exp:
        if constexpr (std::is_same_v<T, float>) {
          return map1<S, S>(
              in, out, [](T x) { return cpu::fast_exp(x); },
              [](const T* x, T* y, int64_t n) { cpu::exp_shifted_row(x, 0.0f, y, n); });
        } else {
          return map1<S, S>(in, out, [](T x) { return std::exp(x); });
        }
      case UnaryOp::log:
        return map1<S, S>(in, out, [](T x) { return std::log(x); });
      case UnaryOp::sqrt:
        return map1<S, S>(in, out, [](T x) { return std::sqrt(x); });
      case UnaryOp::tanh:
        if constexpr (std::is_same_v<T, float>) {
          return map1<S, S>(
              in, out, [](T x) { return cpu::fast_tanh(x); }, cpu::tanh_row);
        } else {
          return map1<S, S>(in, out, [](T x) { return std::tanh(x); });
        }
      case UnaryOp::sigmoid:
        if constexpr (std::is_same_v<T, float>) {
          return map1<S, S>(
              in, out, [](T x) { return cpu::sigmoid(x); }, cpu::sigmoid_row);
        } else {
          return map1<S, S>(in, out, [](T x) { return cpu::sigmoid(x); });
        }
      case UnaryOp::gelu:
        if constexpr (std::is_same_v<S, cpu::BFloat16>) {
          return gelu_bf16(in, out);
        } else if constexpr (std::is_same_v<T, float>) {
          return map1<S, S>(
              in, out, [](T x) { return cpu::gelu(x); }, cpu::gelu_row);
        } else {
          return map1<S, S>(in, out, [](T x) { return cpu::gelu(x); });
        }
      default:
        break;
    }
  }
  throw Error(detail::concat("unary: op not supported for dtype ", in.dtype()));
}

template <typename S>
void compare_typed(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  using T = compute_t<S>;
  switch (op) {
    case BinaryOp::eq:
      return map2<bool, S>(a, b, out, [](T x, T y) { return x == y; });
    case BinaryOp::ne:
      return map2<bool, S>(a, b, out, [](T x, T y) { return x != y; });
    case BinaryOp::lt:
      return map2<bool, S>(a, b, out, [](T x, T y) { return x < y; });
    case BinaryOp::le:
      return map2<bool, S>(a, b, out, [](T x, T y) { return x <= y; });
    case BinaryOp::gt:
      return map2<bool, S>(a, b, out, [](T x, T y) { return x > y; });
    case BinaryOp::ge:
      return map2<bool, S>(a, b, out, [](T x, T y) { return x >= y; });
    default:
      throw Error("compare: not a comparison");
  }
}

template <typename S>
void binary_typed(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  using T = compute_t<S>;
  switch (op) {
    case BinaryOp::add:
      return map2<S, S>(a, b, out, [](T x, T y) { return T(x + y); });
    case BinaryOp::sub:
      return map2<S, S>(a, b, out, [](T x, T y) { return T(x - y); });
    case BinaryOp::mul:
      return map2<S, S>(a, b, out, [](T x, T y) { return T(x * y); });
    case BinaryOp::maximum:
      return map2<S, S>(a, b, out, [](T x, T y) { return x > y || x != x ? x : y; });
    case BinaryOp::minimum:
      return map2<S, S>(a, b, out, [](T x, T y) { return x < y || x != x ? x : y; });
    case BinaryOp::div:
      if constexpr (std::is_integral_v<T>) {
        PIPIT_CHECK(false, "div: integer division is not supported; convert to a float dtype");
      }
      return map2<S, S>(a, b, out, [](T x, T y) { return T(x / y); });
    default:
      break;
  }
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case BinaryOp::pow:
        return map2<S, S>(a, b, out, [](T x, T y) { return std::pow(x, y); });
      case BinaryOp::relu_backward:
        return map2<S, S>(a, b, out, [](T g, T x) { return x > 0 ? g : T(0); });
      case BinaryOp::tanh_backward:
        return map2<S, S>(a, b, out, [](T g, T y) { return g * (T(1) - y * y); });
      case BinaryOp::sigmoid_backward:
        return map2<S, S>(a, b, out, [](T g, T y) { return g * (y * (T(1) - y)); });
      case BinaryOp::gelu_backward:
        if constexpr (std::is_same_v<S, cpu::BFloat16>) {
          return gelu_backward_bf16(a, b, out);
        } else if constexpr (std::is_same_v<T, float>) {
          return map2<S, S>(
              a, b, out, [](T g, T x) { return g * cpu::gelu_derivative(x); },
              cpu::gelu_backward_row);
        } else {
          return map2<S, S>(a, b, out, [](T g, T x) { return g * cpu::gelu_derivative(x); });
        }
      default:
        break;
    }
  }
  throw Error(detail::concat("binary: op not supported for dtype ", a.dtype()));
}

bool is_comparison(BinaryOp op) {
  return op == BinaryOp::eq || op == BinaryOp::ne || op == BinaryOp::lt || op == BinaryOp::le ||
         op == BinaryOp::gt || op == BinaryOp::ge;
}

}  // namespace

void CpuBackend::unary(UnaryOp op, const Tensor& in, const Tensor& out) {
  PIPIT_DISPATCH_NUMERIC_AND_HALF(in.dtype(), "unary", unary_typed<scalar_t>(op, in, out));
}

void CpuBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (is_comparison(op)) {
    if (a.dtype() == DType::b8) return compare_typed<bool>(op, a, b, out);
    PIPIT_DISPATCH_NUMERIC_AND_HALF(a.dtype(), "compare", compare_typed<scalar_t>(op, a, b, out));
    return;
  }
  if (a.dtype() != b.dtype()) {
    // The reference for CUDA's widening add: the same sums, through an f32 copy here.
    check_widening_add(op, a, b, out);
    return binary_typed<float>(op, cpu::widened(a), cpu::widened(b), out);
  }
  PIPIT_DISPATCH_NUMERIC_AND_HALF(a.dtype(), "binary", binary_typed<scalar_t>(op, a, b, out));
}

void CpuBackend::where(const Tensor& mask, const Tensor& a, const Tensor& b, const Tensor& out) {
  PIPIT_DISPATCH_ALL(out.dtype(), "where", {
    using T = scalar_t;
    auto loop = cpu::make_loop<4>(out.shape(), {&out, &mask, &a, &b});
    cpu::for_each_row<4>(loop, {byte_ptr(out), byte_ptr(mask), byte_ptr(a), byte_ptr(b)},
                         {sizeof(T), 1, sizeof(T), sizeof(T)}, [&](auto p, int64_t n, auto s) {
                           T* o = reinterpret_cast<T*>(p[0]);
                           const bool* m = reinterpret_cast<const bool*>(p[1]);
                           const T* x = reinterpret_cast<const T*>(p[2]);
                           const T* y = reinterpret_cast<const T*>(p[3]);
                           // masked_fill and its backward: a scalar against a contiguous run.
                           // GCC vectorizes the select on mask bytes read as uint8_t, not bool.
                           if (s[0] == 1 && s[1] == 1 && s[2] == 0 && s[3] == 1) {
                             const uint8_t* mb = reinterpret_cast<const uint8_t*>(m);
                             const T xv = *x;
                             for (int64_t i = 0; i < n; ++i) {
                               const T yv = y[i];
                               o[i] = mb[i] != 0 ? xv : yv;
                             }
                             return;
                           }
                           for (int64_t i = 0; i < n; ++i) {
                             o[i * s[0]] = m[i * s[1]] ? x[i * s[2]] : y[i * s[3]];
                           }
                         });
  });
}

}  // namespace pipit
