#include "autograd/matmul.h"

#include <type_traits>

#include "autograd/autocast.h"
#include "autograd/node.h"
#include "autograd/reduce.h"
#include "autograd/shape_ops.h"
#include "tensor/backend.h"

namespace pipit {
namespace {

// Inside an AutocastGuard, products of f32 and autocast-dtype operands compute in the autocast
// dtype, their operands rounded to it (as torch's autocast casts them).
bool autocasts(const Tensor& a, const Tensor& b) {
  const DType autocast = autocast_dtype();
  auto castable = [autocast](DType d) { return d == DType::f32 || d == autocast; };
  return autocast != DType::f32 && castable(a.dtype()) && castable(b.dtype());
}

// The dtype a product computes in and returns.
DType compute_dtype(const Tensor& a, const Tensor& b, const char* op) {
  if (autocasts(a, b)) return autocast_dtype();
  PIPIT_CHECK(a.dtype() == b.dtype(), op, ": dtypes differ (", a.dtype(), " and ", b.dtype(), ")");
  return a.dtype();
}

// a @ b into a new tensor of out_dtype: the operands' dtype, or f32 for half operands (the
// f32 sums kept, for gradients that go to f32 tensors).
Tensor matmul_raw(const Tensor& a, const Tensor& b, DType out_dtype) {
  PIPIT_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul: needs tensors of rank >= 2, got ",
              shape_str(a.shape()), " and ", shape_str(b.shape()));
  PIPIT_CHECK(a.dtype() == b.dtype(), "matmul: dtypes differ (", a.dtype(), " and ", b.dtype(),
              ")");
  const int64_t M = a.shape()[a.dim() - 2], K = a.shape()[a.dim() - 1];
  const int64_t K2 = b.shape()[b.dim() - 2], N = b.shape()[b.dim() - 1];
  PIPIT_CHECK(K == K2, "matmul: inner dims differ for shapes ", shape_str(a.shape()), " and ",
              shape_str(b.shape()));
  Shape batch = broadcast_shapes(Shape(a.shape().begin(), a.shape().end() - 2),
                                 Shape(b.shape().begin(), b.shape().end() - 2), "matmul");
  Shape a_shape = batch, b_shape = batch, out_shape = batch;
  a_shape.insert(a_shape.end(), {M, K});
  b_shape.insert(b_shape.end(), {K, N});
  out_shape.insert(out_shape.end(), {M, N});
  Tensor out = Tensor::empty(out_shape, out_dtype, a.device());
  NoGradGuard no_grad;
  backend(a).matmul(expand(a, a_shape), expand(b, b_shape), out, false);
  return out;
}

Tensor mT(const Tensor& t) {
  return transpose(t, -1, -2);
}

// a and b are saved in the compute dtype: under autocast the backward reads the same rounded
// operands the forward multiplied, and they take half the memory. The gradients go back in the
// inputs' own dtypes, an f32 one straight from the f32 sums.
struct MatmulBackward : Node {
  Tensor a, b;
  DType a_dtype = DType::f32, b_dtype = DType::f32;
  std::vector<Tensor> apply(const Tensor& g_out) override {
    const Tensor g = autocast_operand(g_out, a.dtype());
    Tensor ga, gb;
    if (next[0]) ga = sum_to(matmul_raw(g, mT(b), a_dtype), a.shape());
    if (next[1]) {
      if (b.dim() == 2 && a.dim() > 2) {
        // A weight shared across the batch: one GEMM over all rows instead of a batch of them.
        gb = matmul_raw(mT(reshape(a, {-1, a.shape().back()})), reshape(g, {-1, g.shape().back()}),
                        b_dtype);
      } else {
        gb = sum_to(matmul_raw(mT(a), g, b_dtype), b.shape());
      }
    }
    return {ga, gb};
  }
  std::string name() const override { return "MatmulBackward"; }
};

struct LinearBackward : Node {
  Tensor x, weight;  // in the compute dtype, as for MatmulBackward
  DType x_dtype = DType::f32, weight_dtype = DType::f32, bias_dtype = DType::f32;
  std::vector<Tensor> apply(const Tensor& g) override {
    const int64_t out_features = weight.shape()[0];
    Tensor g2 = reshape(g, {-1, out_features});
    Tensor g2_compute = autocast_operand(g2, weight.dtype());
    Tensor gx, gw, gb;
    if (next[0]) gx = reshape(matmul_raw(g2_compute, weight, x_dtype), x.shape());
    const bool bias_grad = next.size() == 3 && next[2];
    if (next[1] && bias_grad && bias_dtype == weight_dtype) {
      // Both from one read of the output's gradient.
      NoGradGuard no_grad;
      gw = Tensor::empty(weight.shape(), weight_dtype, weight.device());
      gb = Tensor::empty({out_features}, bias_dtype, weight.device());
      backend(gw).matmul_bias_grad(mT(g2_compute), reshape(x, {-1, x.shape().back()}), gw, gb);
      return {gx, gw, gb};
    }
    if (next[1]) gw = matmul_raw(mT(g2_compute), reshape(x, {-1, x.shape().back()}), weight_dtype);
    if (bias_grad) {
      NoGradGuard no_grad;
      gb = sum(g2, {0}).to(bias_dtype);
    }
    if (next.size() == 2) return {gx, gw};
    return {gx, gw, gb};
  }
  std::string name() const override { return "LinearBackward"; }
};

// The GELU's gradient through its saved input (the product plus bias), then Linear's.
struct LinearGeluBackward : LinearBackward {
  Tensor pre;  // in the compute dtype
  std::vector<Tensor> apply(const Tensor& g) override {
    Tensor grad_pre = Tensor::empty(pre.shape(), pre.dtype(), pre.device());
    {
      NoGradGuard no_grad;
      backend(pre).binary(BinaryOp::gelu_backward, autocast_operand(g, pre.dtype()), pre, grad_pre);
    }
    return LinearBackward::apply(grad_pre);
  }
  std::string name() const override { return "LinearGeluBackward"; }
};

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  const DType compute = compute_dtype(a, b, "matmul");
  const Tensor a_compute = autocast_operand(a, compute), b_compute = autocast_operand(b, compute);
  Tensor out = matmul_raw(a_compute, b_compute, compute);
  if (auto node = detail::make_node<MatmulBackward>(out, {a, b})) {
    node->a = a_compute.detach();
    node->b = b_compute.detach();
    node->a_dtype = a.dtype();
    node->b_dtype = b.dtype();
  }
  return out;
}

namespace {

// linear, or with `gelu` linear_gelu: the node type and, for GELU, its saved input differ.
template <typename NodeType>
Tensor linear_product(const Tensor& x, const Tensor& weight, const Tensor& bias, bool gelu) {
  PIPIT_CHECK(weight.dim() == 2, "linear: weight must be 2-D, got ", shape_str(weight.shape()));
  PIPIT_CHECK(x.dim() >= 1 && x.shape().back() == weight.shape()[1], "linear: input of shape ",
              shape_str(x.shape()), " does not match weight of shape ", shape_str(weight.shape()));
  const int64_t out_features = weight.shape()[0];
  const DType compute = compute_dtype(x, weight, "linear");
  const Tensor x_compute = autocast_operand(x, compute),
               weight_compute = autocast_operand(weight, compute);
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  Tensor out = Tensor::empty(out_shape, compute, x.device());
  Tensor pre = gelu ? Tensor::empty(out_shape, compute, x.device()) : Tensor();
  {
    NoGradGuard no_grad;
    Tensor x2 = reshape(x_compute, {-1, x.shape().back()});
    auto as_rows = [&](const Tensor& t) {
      return Tensor::from_storage(t.storage(), {x2.shape()[0], out_features}, {out_features, 1}, 0,
                                  t.dtype());
    };
    if (bias.defined()) {
      PIPIT_CHECK(bias.shape() == Shape{out_features}, "linear: bias of shape ",
                  shape_str(bias.shape()), " does not match ", out_features, " outputs");
      const Tensor bias_compute = autocast_operand(bias, out.dtype()).contiguous();
      if (gelu) {
        backend(x).matmul_bias_gelu(x2, mT(weight_compute), bias_compute, as_rows(pre),
                                    as_rows(out));
      } else {
        backend(x).matmul_bias(x2, mT(weight_compute), bias_compute, as_rows(out));
      }
    } else {
      backend(x).matmul(x2, mT(weight_compute), as_rows(out), false);
    }
  }
  auto node = bias.defined() ? detail::make_node<NodeType>(out, {x, weight, bias})
                             : detail::make_node<NodeType>(out, {x, weight});
  if (node) {
    node->x = x_compute.detach();
    node->weight = weight_compute.detach();
    node->x_dtype = x.dtype();
    node->weight_dtype = weight.dtype();
    if (bias.defined()) node->bias_dtype = bias.dtype();
    if constexpr (std::is_same_v<NodeType, LinearGeluBackward>) node->pre = pre;
  }
  return out;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return linear_product<LinearBackward>(x, weight, bias, false);
}

Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  PIPIT_CHECK(bias.defined(), "linear_gelu: needs a bias");
  return linear_product<LinearGeluBackward>(x, weight, bias, true);
}

}  // namespace pipit
