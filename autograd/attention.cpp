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

// The dtype attention computes in: under autocast (bf16/f16) f32 and autocast-dtype inputs
// compute in the autocast dtype, as for matmul.
DType attention_dtype(const Tensor& q, const Tensor& k, const Tensor& v, const char* op) {
  const DType autocast = autocast_dtype();
  auto castable = [autocast](const Tensor& t) {
    return t.dtype() == DType::f32 || t.dtype() == autocast;
  };
  const bool autocasts = autocast != DType::f32 && castable(q) && castable(k) && castable(v);
  const DType dtype = autocasts ? autocast : q.dtype();
  PIPIT_CHECK(autocasts || (is_floating(dtype) && k.dtype() == dtype && v.dtype() == dtype), op,
              ": q, k and v need one floating dtype, got ", q.dtype(), ", ", k.dtype(), ", ",
              v.dtype());
  return dtype;
}

// What the backward needs, in the compute dtype (the forward's q, k, v and output, and each
// query's log-sum-exp), and the kernel call that writes the three gradients wherever the caller
// wants them.
struct Attended {
  Tensor q, k, v, out, lse;
  double scale = 1;
  bool causal = false;

  void gradients(const Tensor& g, const Tensor& grad_q, const Tensor& grad_k,
                 const Tensor& grad_v) const {
    const Tensor grad_out = kernel_operand(g, q.dtype());
    backend(q).attention_backward(grad_out, q, k, v, out, lse, scale, causal, grad_q, grad_k,
                                  grad_v);
  }
};

// The forward kernel on q, k, v already in the compute dtype; out is a [B, H, Tq, D] view of
// [B, Tq, H, D] memory.
Attended attend(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                std::optional<double> scale) {
  Attended a{q, k, v, Tensor(), Tensor(), 1, causal};
  const int64_t B = q.shape()[0], H = q.shape()[1], Tq = q.shape()[2], D = q.shape()[3];
  a.scale = scale.value_or(1.0 / std::sqrt(static_cast<double>(D)));
  a.lse = Tensor::empty({B, H, Tq}, accumulate_dtype(q.dtype()), q.device());
  {
    NoGradGuard no_grad;
    a.out = transpose(Tensor::empty({B, Tq, H, D}, q.dtype(), q.device()), 1, 2);
  }
  backend(q).attention(q, k, v, a.scale, causal, a.out, a.lse);
  return a;
}

// Each gradient goes back in its input's dtype (f32 for an f32 input under autocast).
struct AttentionBackward : Node {
  Attended saved;
  DType q_dtype = DType::f32, k_dtype = DType::f32, v_dtype = DType::f32;
  std::vector<Tensor> apply(const Tensor& g) override {
    const Tensor& q = saved.q;
    Tensor gq = Tensor::empty(q.shape(), q.dtype(), q.device());
    Tensor gk = Tensor::empty(saved.k.shape(), q.dtype(), q.device());
    Tensor gv = Tensor::empty(saved.v.shape(), q.dtype(), q.device());
    saved.gradients(g, gq, gk, gv);
    NoGradGuard no_grad;
    return {gq.to(q_dtype), gk.to(k_dtype), gv.to(v_dtype)};
  }
  std::string name() const override { return "AttentionBackward"; }
};

// The three gradients land in one [B, T, 3 * H * D] tensor, laid out as qkv.
struct PackedAttentionBackward : Node {
  Attended saved;
  Shape qkv_shape;
  DType qkv_dtype = DType::f32;
  int64_t heads = 1;
  std::vector<Tensor> apply(const Tensor& g) override {
    Tensor grad = Tensor::empty(qkv_shape, saved.q.dtype(), saved.q.device());
    NoGradGuard no_grad;
    const auto [gq, gk, gv] = split_packed_heads(grad, heads);
    saved.gradients(g, gq, gk, gv);
    return {grad.to(qkv_dtype)};
  }
  std::string name() const override { return "PackedAttentionBackward"; }
};

}  // namespace

std::array<Tensor, 3> split_packed_heads(const Tensor& qkv, int64_t heads) {
  const int64_t B = qkv.shape()[0], T = qkv.shape()[1], D = qkv.shape()[2] / (3 * heads);
  const Tensor split = permute(reshape(qkv, {B, T, 3, heads, D}), {2, 0, 3, 1, 4});
  return {squeeze(narrow(split, 0, 0, 1), 0), squeeze(narrow(split, 0, 1, 1), 0),
          squeeze(narrow(split, 0, 2, 1), 0)};
}

Tensor scaled_dot_product_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                    bool is_causal, std::optional<double> scale) {
  PIPIT_CHECK(q_in.dim() == 4 && k_in.dim() == 4 && v_in.dim() == 4,
              "scaled_dot_product_attention: expects q [B, H, Tq, D] and k, v [B, H, Tk, D], got ",
              shape_str(q_in.shape()), ", ", shape_str(k_in.shape()), ", ",
              shape_str(v_in.shape()));
  PIPIT_CHECK(q_in.device() == k_in.device() && q_in.device() == v_in.device(),
              "scaled_dot_product_attention: q, k and v are on different devices");
  const DType dtype = attention_dtype(q_in, k_in, v_in, "scaled_dot_product_attention");
  Attended a = attend(kernel_operand(q_in, dtype), kernel_operand(k_in, dtype),
                      kernel_operand(v_in, dtype), is_causal, scale);
  Tensor out = a.out;
  if (auto node = detail::make_node<AttentionBackward>(out, {q_in, k_in, v_in})) {
    node->saved = std::move(a);
    node->saved.out = out.detach();
    node->q_dtype = q_in.dtype();
    node->k_dtype = k_in.dtype();
    node->v_dtype = v_in.dtype();
  }
  return out;
}

Tensor packed_self_attention(const Tensor& qkv_in, int64_t heads, bool is_causal,
                             std::optional<double> scale) {
  PIPIT_CHECK(qkv_in.dim() == 3 && heads > 0 && qkv_in.shape()[2] > 0 &&
                  qkv_in.shape()[2] % (3 * heads) == 0,
              "packed_self_attention: expects qkv [B, T, 3 * heads * D] for ", heads,
              " heads, got ", shape_str(qkv_in.shape()));
  const DType dtype = attention_dtype(qkv_in, qkv_in, qkv_in, "packed_self_attention");
  std::array<Tensor, 3> heads_in;
  {
    NoGradGuard no_grad;
    const Tensor qkv =
        qkv_in.dtype() == dtype ? qkv_in.contiguous() : qkv_in.to(dtype).contiguous();
    heads_in = split_packed_heads(qkv, heads);
  }
  Attended a = attend(heads_in[0], heads_in[1], heads_in[2], is_causal, scale);
  Tensor out = a.out;
  if (auto node = detail::make_node<PackedAttentionBackward>(out, {qkv_in})) {
    node->saved = std::move(a);
    node->saved.out = out.detach();
    node->qkv_shape = qkv_in.shape();
    node->qkv_dtype = qkv_in.dtype();
    node->heads = heads;
  }
  return out;
}

}  // namespace pipit
