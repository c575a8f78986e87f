#pragma once
// Fused scaled dot-product attention, as torch.nn.functional.scaled_dot_product_attention.
#include <array>
#include <optional>

#include "tensor/tensor.h"

namespace pipit {

// softmax(scale * q k^T) v for q [B, H, Tq, D] and k, v [B, H, Tk, D], in one kernel each way
// that never holds the [Tq, Tk] weights (FlashAttention's scheme). With is_causal query i sees
// keys 0..i + Tk - Tq, so the last query sees every key (a KV cache's new tokens). scale
// defaults to 1 / sqrt(D). The result is a [B, H, Tq, D] view of [B, Tq, H, D] memory: merging
// the heads back ([B, Tq, H * D]) is a free reshape. Under autocast (bf16/f16) f32 inputs are
// rounded to that dtype and the result has it, as for matmul. Gradients are deterministic.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    bool is_causal = false,
                                    std::optional<double> scale = std::nullopt);

// Self-attention of q, k and v packed as one projection writes them (GPT-2's c_attn): qkv
// [B, T, 3 * heads * D] holds q | k | v, each [heads, D] per position. The same bits as
// scaled_dot_product_attention on the three [B, heads, T, D] views of qkv, but the backward
// writes the three gradients straight into one tensor shaped as qkv, where splitting qkv in the
// graph would fill three of that size with zeros and add them up.
Tensor packed_self_attention(const Tensor& qkv, int64_t heads, bool is_causal = false,
                             std::optional<double> scale = std::nullopt);

// qkv laid out as packed_self_attention reads it -> its q, k and v as [B, heads, T, D] views
// (differentiable), for attention written out.
std::array<Tensor, 3> split_packed_heads(const Tensor& qkv, int64_t heads);

}  // namespace pipit
