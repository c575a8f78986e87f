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

// What Linear's backward reads: x and weight as the product used them (in the compute dtype,
// as for MatmulBackward) and the dtypes the gradients go back in.
struct SavedLinear {
  Tensor x, weight;
  DType x_dtype = DType::f32, weight_dtype = DType::f32, bias_dtype = DType::f32;

  // The gradients of x, weight and bias that are wanted, from the output's gradient g.
  std::vector<Tensor> grads(const Tensor& g, bool want_x, bool want_weight, bool want_bias) const {
    const int64_t out_features = weight.shape()[0];
    Tensor g2 = reshape(g, {-1, out_features});
    Tensor g2_compute = autocast_operand(g2, weight.dtype());
    Tensor gx, gw, gb;
    if (want_x) gx = reshape(matmul_raw(g2_compute, weight, x_dtype), x.shape());
    if (want_weight && want_bias && bias_dtype == weight_dtype) {
      // Both from one read of the output's gradient.
      NoGradGuard no_grad;
      gw = Tensor::empty(weight.shape(), weight_dtype, weight.device());
      gb = Tensor::empty({out_features}, bias_dtype, weight.device());
      backend(gw).matmul_bias_grad(mT(g2_compute), reshape(x, {-1, x.shape().back()}), gw, gb);
      return {gx, gw, gb};
    }
    if (want_weight) {
      gw = matmul_raw(mT(g2_compute), reshape(x, {-1, x.shape().back()}), weight_dtype);
    }
    if (want_bias) {
      NoGradGuard no_grad;
      gb = sum(g2, {0}).to(bias_dtype);
    }
    return {gx, gw, gb};
  }
};

struct LinearBackward : Node {
  SavedLinear saved;
  std::vector<Tensor> apply(const Tensor& g) override {
    std::vector<Tensor> grads =
        saved.grads(g, next[0] != nullptr, next[1] != nullptr, next.size() == 3 && next[2]);
    grads.resize(next.size());
    return grads;
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

// An MLP, linear(linear_gelu(x)): the second product's gradient with respect to its input and
// the GELU's derivative in one pass (matmul_dgelu), then the first Linear's gradients.
struct GeluMlpBackward : Node {
  SavedLinear fc, proj;
  Tensor pre;  // the GELU's input, in the compute dtype
  // A split backward (autograd/split_backward.h) asks for x's gradient first and the weights'
  // later: the GELU input's gradient is kept for the second call, not computed again.
  Tensor kept_grad_pre;
  std::vector<Tensor> apply(const Tensor& g) override {
    const bool all_weights = next[1] && next[2] && next[3] && next[4];
    const std::vector<Tensor> proj_grads =
        proj.grads(g, false, next[3] != nullptr, next[4] != nullptr);
    Tensor grad_pre = std::move(kept_grad_pre);
    if (!grad_pre.defined()) {
      NoGradGuard no_grad;
      grad_pre = Tensor::empty(pre.shape(), pre.dtype(), pre.device());
      const int64_t hidden = pre.shape().back();
      const Tensor g2 = autocast_operand(reshape(g, {-1, proj.weight.shape()[0]}), pre.dtype());
      backend(pre).matmul_dgelu(g2, proj.weight, reshape(pre, {-1, hidden}),
                                reshape(grad_pre, {-1, hidden}));
    }
    if (next[0] && !all_weights) kept_grad_pre = grad_pre;
    const std::vector<Tensor> fc_grads =
        fc.grads(grad_pre, next[0] != nullptr, next[1] != nullptr, next[2] != nullptr);
    return {fc_grads[0], fc_grads[1], fc_grads[2], proj_grads[1], proj_grads[2]};
  }
  std::string name() const override { return "GeluMlpBackward"; }
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

// A product of linear or linear_gelu, and what its backward reads.
struct LinearProduct {
  Tensor out, pre;  // pre: GELU's input, with `gelu`
  SavedLinear saved;
};

LinearProduct linear_product(const Tensor& x, const Tensor& weight, const Tensor& bias, bool gelu) {
  PIPIT_CHECK(weight.dim() == 2, "linear: weight must be 2-D, got ", shape_str(weight.shape()));
  PIPIT_CHECK(x.dim() >= 1 && x.shape().back() == weight.shape()[1], "linear: input of shape ",
              shape_str(x.shape()), " does not match weight of shape ", shape_str(weight.shape()));
  const int64_t out_features = weight.shape()[0];
  const DType compute = compute_dtype(x, weight, "linear");
  LinearProduct p;
  p.saved = {autocast_operand(x, compute).detach(), autocast_operand(weight, compute).detach(),
             x.dtype(), weight.dtype(), bias.defined() ? bias.dtype() : DType::f32};
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  p.out = Tensor::empty(out_shape, compute, x.device());
  if (gelu) p.pre = Tensor::empty(out_shape, compute, x.device());
  NoGradGuard no_grad;
  Tensor x2 = reshape(p.saved.x, {-1, x.shape().back()});
  auto as_rows = [&](const Tensor& t) {
    return Tensor::from_storage(t.storage(), {x2.shape()[0], out_features}, {out_features, 1}, 0,
                                t.dtype());
  };
  const Tensor w_t = mT(p.saved.weight);
  if (!bias.defined()) {
    backend(x).matmul(x2, w_t, as_rows(p.out), false);
    return p;
  }
  PIPIT_CHECK(bias.shape() == Shape{out_features}, "linear: bias of shape ",
              shape_str(bias.shape()), " does not match ", out_features, " outputs");
  const Tensor bias_compute = autocast_operand(bias, compute).contiguous();
  if (gelu) {
    backend(x).matmul_bias_gelu(x2, w_t, bias_compute, as_rows(p.pre), as_rows(p.out));
  } else {
    backend(x).matmul_bias(x2, w_t, bias_compute, as_rows(p.out));
  }
  return p;
}

template <typename NodeType>
Tensor linear_op(const Tensor& x, const Tensor& weight, const Tensor& bias, bool gelu) {
  LinearProduct p = linear_product(x, weight, bias, gelu);
  auto node = bias.defined() ? detail::make_node<NodeType>(p.out, {x, weight, bias})
                             : detail::make_node<NodeType>(p.out, {x, weight});
  if (node) {
    node->saved = p.saved;
    if constexpr (std::is_same_v<NodeType, LinearGeluBackward>) node->pre = p.pre;
  }
  return p.out;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return linear_op<LinearBackward>(x, weight, bias, false);
}

Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  PIPIT_CHECK(bias.defined(), "linear_gelu: needs a bias");
  return linear_op<LinearGeluBackward>(x, weight, bias, true);
}

Tensor linear_gelu_linear(const Tensor& x, const Tensor& fc_weight, const Tensor& fc_bias,
                          const Tensor& proj_weight, const Tensor& proj_bias) {
  PIPIT_CHECK(fc_bias.defined() && proj_bias.defined(), "linear_gelu_linear: needs both biases");
  const LinearProduct fc = linear_product(x, fc_weight, fc_bias, true);
  LinearProduct proj = linear_product(fc.out, proj_weight, proj_bias, false);
  if (auto node = detail::make_node<GeluMlpBackward>(
          proj.out, {x, fc_weight, fc_bias, proj_weight, proj_bias})) {
    node->fc = fc.saved;
    node->proj = proj.saved;
    node->pre = fc.pre;
  }
  return proj.out;
}

}  // namespace pipit
