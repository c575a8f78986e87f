#pragma once
// The GPT building blocks.
#include "nn/layers.h"

namespace pipit {

// A layer's keys and values for the tokens generated so far, [B, H, capacity, D] each, so
// generating a token runs the model on that token alone. Allocated once per generation.
struct KvCacheLayer {
  Tensor keys, values;
};

// Multi-head causal self-attention: one Linear "qkv" (C -> 3C, laid out q | k | v, each split
// into heads of C / heads), scaled dot products masked so position t sees positions <= t,
// softmax, and a Linear "proj" (C -> C). Input and output [B, T, C]. It runs
// scaled_dot_product_attention, the fused kernel, unless dropout on the weights needs them in
// memory (training with dropout > 0) or the product is f32 on CUDA (see transformer.cpp).
class CausalSelfAttention final : public Module {
 public:
  CausalSelfAttention(int64_t width, int64_t heads, double dropout = 0.0,
                      Generator* generator = nullptr);
  Tensor forward(const Tensor& x) override;
  // x [B, T, C] holds the tokens at positions [start, start + T): their keys and values are
  // written into `cache` there, and each query attends to the cached positions up to its own.
  // `mask`, when defined, is added to the scores ([B, 1, T, start + T], 0 or -inf) and takes
  // the place of the causal rule (left-padded rows mask their padding).
  Tensor forward_step(const Tensor& x, KvCacheLayer& cache, int64_t start, const Tensor& mask);
  json config() const override;
  int64_t heads() const { return heads_; }
  std::shared_ptr<Linear> qkv, proj;

 private:
  int64_t width_, heads_;
  double dropout_;
  std::shared_ptr<Dropout> attn_dropout_, out_dropout_;
};

// Pre-norm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x)) where the MLP is
// fc (C -> 4C), GELU, proj (4C -> C). Children: ln1, attn, ln2, fc, proj.
class TransformerBlock final : public Module {
 public:
  TransformerBlock(int64_t width, int64_t heads, double dropout = 0.0,
                   Generator* generator = nullptr, double layer_norm_eps = 1e-5);
  Tensor forward(const Tensor& x) override;
  // forward with the attention's keys and values cached (CausalSelfAttention::forward_step).
  Tensor forward_step(const Tensor& x, KvCacheLayer& cache, int64_t start, const Tensor& mask);
  json config() const override;
  std::shared_ptr<LayerNorm> ln1, ln2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<Linear> fc, proj;

 private:
  // proj(gelu(fc(x))), one fused op (linear_gelu_linear).
  Tensor mlp(const Tensor& x);
  int64_t width_, heads_;
  double dropout_, layer_norm_eps_;
  std::shared_ptr<Dropout> mlp_dropout_;
};

}  // namespace pipit
