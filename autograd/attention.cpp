#include "autograd/attention.h"

#include <cmath>

#include "autograd/autocast.h"
#include "autograd/node.h"
#include "autograd/shape_ops.h"
#include "tensor/backend.h"
#include "tensor/kernel_layout.h"

namespace pipit {
namespace {

// t in `dtype` with unit stride in its last dim, outside the graph (a copy only when needed).
Tensor kernel_operand(const Tensor& t, DType dtype) {
  NoGradGuard no_grad;
  if (t.dtype() != dtype) return t.to(dtype);
  return t.strides().back() == 1 ? t : t.contiguous();
}

// q, k, v, the output and lse are saved in the compute dtype; each gradient goes back in its
// input's dtype (f32 for an f32 input under autocast).
struct AttentionBackward : Node {
  Tensor q, k, v, out, lse;
  double scale = 1;
  bool causal = false;
  DType q_dtype = DType::f32, k_dtype = DType::f32, v_dtype = DType::f32;
  std::vector<Tensor> apply(const Tensor& g) override {
    const Tensor grad_out = kernel_operand(g, q.dtype());
    Tensor gq = Tensor::empty(q.shape(), q.dtype(), q.device());
    Tensor gk = Tensor::empty(k.shape(), k.dtype(), k.device());
    Tensor gv = Tensor::empty(v.shape(), v.dtype(), v.device());
    backend(q).attention_backward(grad_out, q, k, v, out, lse, scale, causal, gq, gk, gv);
    NoGradGuard no_grad;
    return {gq.to(q_dtype), gk.to(k_dtype), gv.to(v_dtype)};
  }
  std::string name() const override { return "AttentionBackward"; }
};

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                    bool is_causal, std::optional<double> scale) {
  PIPIT_CHECK(q_in.dim() == 4 && k_in.dim() == 4 && v_in.dim() == 4,
              "scaled_dot_product_attention: expects q [B, H, Tq, D] and k, v [B, H, Tk, D], got ",
              shape_str(q_in.shape()), ", ", shape_str(k_in.shape()), ", ",
              shape_str(v_in.shape()));
  PIPIT_CHECK(q_in.device() == k_in.device() && q_in.device() == v_in.device(),
              "scaled_dot_product_attention: q, k and v are on different devices");
  // Under autocast f32 and autocast-dtype inputs compute in the autocast dtype, as for matmul.
  const DType autocast = autocast_dtype();
  auto castable = [autocast](const Tensor& t) {
    return t.dtype() == DType::f32 || t.dtype() == autocast;
  };
  const bool autocasts =
      autocast != DType::f32 && castable(q_in) && castable(k_in) && castable(v_in);
  const DType dtype = autocasts ? autocast : q_in.dtype();
  PIPIT_CHECK(autocasts || (is_floating(dtype) && k_in.dtype() == dtype && v_in.dtype() == dtype),
              "scaled_dot_product_attention: q, k and v need one floating dtype, got ",
              q_in.dtype(), ", ", k_in.dtype(), ", ", v_in.dtype());
  const Tensor q = kernel_operand(q_in, dtype), k = kernel_operand(k_in, dtype),
               v = kernel_operand(v_in, dtype);
  const int64_t B = q.shape()[0], H = q.shape()[1], Tq = q.shape()[2], D = q.shape()[3];
  const double s = scale.value_or(1.0 / std::sqrt(static_cast<double>(D)));
  Tensor out, lse = Tensor::empty({B, H, Tq}, accumulate_dtype(dtype), q.device());
  {
    NoGradGuard no_grad;
    out = transpose(Tensor::empty({B, Tq, H, D}, dtype, q.device()), 1, 2);
  }
  backend(q).attention(q, k, v, s, is_causal, out, lse);
  if (auto node = detail::make_node<AttentionBackward>(out, {q_in, k_in, v_in})) {
    node->q = q.detach();
    node->k = k.detach();
    node->v = v.detach();
    node->out = out.detach();
    node->lse = lse;
    node->scale = s;
    node->causal = is_causal;
    node->q_dtype = q_in.dtype();
    node->k_dtype = k_in.dtype();
    node->v_dtype = v_in.dtype();
  }
  return out;
}

}  // namespace pipit
