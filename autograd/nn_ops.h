#pragma once
// Fused neural-network operations, each one kernel forward and one backward.
#include "tensor/generator.h"
#include "tensor/tensor.h"

namespace pipit {

Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
// Causal attention weights from scores [..., T, T]: softmax over the last dim of scale *
// scores with query i seeing keys 0..i (later keys get 0), i.e.
// softmax(masked_fill(scores * scale, key > query, -inf), -1) in one kernel each way.
Tensor causal_softmax(const Tensor& scores, double scale);
// Normalises over the last dim, then scales by weight and shifts by bias (both [C]).
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
// Rows of weight [V, C] picked by i64 indices of any shape: result [..., C].
Tensor embedding(const Tensor& weight, const Tensor& indices);
// Zeroes each element with probability p and scales the rest by 1 / (1 - p) when training.
Tensor dropout(const Tensor& x, double p, bool training, Generator* generator = nullptr);
// Mean over non-ignored rows of -log softmax(logits)[target]; logits [N, C] or [B, T, C],
// targets i64 [N] or [B, T]. Half logits are read as they are and give an f32 loss.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);
// The rows of targets that are not ignore_index, as an f64 scalar on their device: the mean's
// divisor, counted without waiting for the device.
Tensor cross_entropy_rows(const Tensor& targets, int64_t ignore_index);

}  // namespace pipit
