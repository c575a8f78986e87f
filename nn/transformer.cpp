#include "nn/transformer.h"

#include <cmath>
#include <limits>

#include "autograd/autocast.h"
#include "autograd/ops.h"
#include "tensor/backend.h"

namespace pipit {
CausalSelfAttention::CausalSelfAttention(int64_t width, int64_t heads, double dropout,
                                         Generator* generator)
    : width_(width), heads_(heads), dropout_(dropout) {
  PIPIT_CHECK(heads > 0 && width > 0 && width % heads == 0, "CausalSelfAttention: width ", width,
              " must be a positive multiple of heads ", heads);
  // Before 3 * width is computed (a width from a config can be anything).
  PIPIT_CHECK(width <= std::numeric_limits<int64_t>::max() / 3, "CausalSelfAttention: width ",
              width, " is too large");
  qkv = register_module("qkv", std::make_shared<Linear>(width, 3 * width, true, generator));
  proj = register_module("proj", std::make_shared<Linear>(width, width, true, generator));
  attn_dropout_ = register_module("attn_dropout", std::make_shared<Dropout>(dropout, generator));
  out_dropout_ = register_module("out_dropout", std::make_shared<Dropout>(dropout, generator));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  PIPIT_CHECK(x.dim() == 3 && x.shape()[2] == width_, "CausalSelfAttention: expects [B, T, ",
              width_, "], got ", shape_str(x.shape()));
  const int64_t B = x.shape()[0], T = x.shape()[1], D = width_ / heads_;
  const Tensor packed = qkv->forward(x);
  // Dropout on the weights needs them in memory. So, for now, does f32 on CUDA: there the
  // fused kernel runs on CUDA cores while the written-out products are cuBLAS GEMMs (on TF32
  // tensor cores where allowed), and no GPU run has yet measured which is faster.
  const bool weights_needed = dropout_ > 0 && is_training();
  const bool f32_on_cuda =
      x.device().is_cuda() && x.dtype() == DType::f32 && autocast_dtype() == DType::f32;
  Tensor heads_out;
  if (!weights_needed && !f32_on_cuda) {
    // Fused: the [T, T] weights are never held, the heads' gradients land in one tensor, and
    // the heads merge back for free.
    heads_out = packed_self_attention(packed, heads_, /*is_causal=*/true);
  } else {
    // q, k and v are views of the packed projection, and GEMM reads them in place.
    const auto [q, k, v] = split_packed_heads(packed, heads_);
    // Scale, mask and softmax in one kernel, between two batched GEMMs.
    Tensor weights =
        causal_softmax(matmul(q, transpose(k, -1, -2)), 1.0 / std::sqrt(static_cast<double>(D)));
    heads_out = matmul(attn_dropout_->forward(weights), v);
  }
  Tensor y = reshape(permute(heads_out, {0, 2, 1, 3}), {B, T, width_});
  return out_dropout_->forward(proj->forward(y));
}

Tensor CausalSelfAttention::forward_step(const Tensor& x, KvCacheLayer& cache, int64_t start,
                                         const Tensor& mask) {
  PIPIT_CHECK(x.dim() == 3 && x.shape()[2] == width_, "CausalSelfAttention: expects [B, T, ",
              width_, "], got ", shape_str(x.shape()));
  const int64_t B = x.shape()[0], T = x.shape()[1], D = width_ / heads_;
  const Shape cache_shape = cache.keys.defined() ? cache.keys.shape() : Shape{};
  PIPIT_CHECK(cache_shape.size() == 4 && cache_shape[0] == B && cache_shape[1] == heads_ &&
                  cache_shape[3] == D && start >= 0 && start + T <= cache_shape[2],
              "CausalSelfAttention: positions [", start, ", ", start + T,
              ") do not fit a KV cache of shape ", shape_str(cache_shape), " for ", B, " rows of ",
              heads_, " heads of ", D);
  const auto [q, k, v] = split_packed_heads(qkv->forward(x), heads_);
  backend(k).copy(k, narrow(cache.keys, 2, start, T));
  backend(v).copy(v, narrow(cache.values, 2, start, T));
  const Tensor keys = narrow(cache.keys, 2, 0, start + T);
  const Tensor values = narrow(cache.values, 2, 0, start + T);
  // A cache in autocast's dtype (CachedLayers) holds k and v as autocast would round them;
  // q and the softmax weights are rounded here, so the products are autocast's, bit for bit.
  const DType compute = cache.keys.dtype();
  const Tensor q_compute = autocast_operand(q, compute);
  Tensor heads_out;
  if (!mask.defined()) {
    heads_out = scaled_dot_product_attention(q_compute, keys, values, /*is_causal=*/true);
  } else {
    const Tensor scores =
        matmul(q_compute, transpose(keys, -1, -2)) * (1.0 / std::sqrt(static_cast<double>(D)));
    heads_out = matmul(autocast_operand(softmax(scores + mask, -1), compute), values);
  }
  return proj->forward(reshape(permute(heads_out, {0, 2, 1, 3}), {B, T, width_}));
}

json CausalSelfAttention::config() const {
  return {
      {"type", "CausalSelfAttention"}, {"width", width_}, {"heads", heads_}, {"dropout", dropout_}};
}

TransformerBlock::TransformerBlock(int64_t width, int64_t heads, double dropout,
                                   Generator* generator, double layer_norm_eps)
    : width_(width), heads_(heads), dropout_(dropout), layer_norm_eps_(layer_norm_eps) {
  // Before 4 * width is computed (a width from a config can be anything).
  PIPIT_CHECK(width > 0 && width <= std::numeric_limits<int64_t>::max() / 4,
              "TransformerBlock: width must be positive and not too large, got ", width);
  ln1 = register_module("ln1", std::make_shared<LayerNorm>(width, layer_norm_eps));
  attn = register_module("attn",
                         std::make_shared<CausalSelfAttention>(width, heads, dropout, generator));
  ln2 = register_module("ln2", std::make_shared<LayerNorm>(width, layer_norm_eps));
  fc = register_module("fc", std::make_shared<Linear>(width, 4 * width, true, generator));
  proj = register_module("proj", std::make_shared<Linear>(4 * width, width, true, generator));
  mlp_dropout_ = register_module("mlp_dropout", std::make_shared<Dropout>(dropout, generator));
}

// Under autocast the layer norms' results go straight to products (rounded as those would round
// them), and the residual adds read the sublayers' half outputs as they are: no cast either way.
Tensor TransformerBlock::forward(const Tensor& x) {
  Tensor h = x + attn->forward(ln1->forward_for_products(x));
  return h + mlp_dropout_->forward(mlp(ln2->forward_for_products(h)));
}

Tensor TransformerBlock::forward_step(const Tensor& x, KvCacheLayer& cache, int64_t start,
                                      const Tensor& mask) {
  Tensor h = x + attn->forward_step(ln1->forward_for_products(x), cache, start, mask);
  return h + mlp(ln2->forward_for_products(h));
}

Tensor TransformerBlock::mlp(const Tensor& x) {
  return linear_gelu_linear(x, fc->weight, fc->bias, proj->weight, proj->bias);
}

json TransformerBlock::config() const {
  json out = {
      {"type", "TransformerBlock"}, {"width", width_}, {"heads", heads_}, {"dropout", dropout_}};
  // Written only when it differs from the default, so earlier configs stay as they were.
  if (layer_norm_eps_ != 1e-5) out["layer_norm_eps"] = layer_norm_eps_;
  return out;
}

}  // namespace pipit
