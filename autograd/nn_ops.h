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
// layer_norm for a result that only feeds matrix products (a transformer's attention and
// MLP): inside an AutocastGuard, for f32 x, it comes out in autocast's dtype, rounded once as
// the products would round it, and its gradient comes back in that dtype, as under torch's
// autocast; torch writes the f32 result and casts it, a pass over it each way more.
Tensor layer_norm_for_products(const Tensor& x, const Tensor& weight, const Tensor& bias,
                               double eps = 1e-5);
// Rows of weight [V, C] picked by i64 indices of any shape: result [..., C].
Tensor embedding(const Tensor& weight, const Tensor& indices);
// Zeroes each element with probability p and scales the rest by 1 / (1 - p) when training.
Tensor dropout(const Tensor& x, double p, bool training, Generator* generator = nullptr);
// Mean over non-ignored rows of -log softmax(logits)[target]; logits [N, C] or [B, T, C],
// targets i64 [N] or [B, T]. Half logits are read as they are and give an f32 loss. With
// `classes` only the first `classes` columns take part, as if the rest were -inf (a vocabulary
// padded for the tensor cores, GptConfig::vocab_multiple), and the rest get gradient 0; -1:
// every column.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                     int64_t classes = -1);
// Checks cross_entropy's arguments and returns the columns that take part: C for -1, else
// classes itself, in [1, C].
int64_t check_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t classes);
// cross_entropy's gradient for logits [N, C] (rows of unit stride) and targets [N], outside
// the graph: (softmax - onehot) * scale over the first `classes` columns, 0 in the others;
// softmax from the forward's row stats when given (Backend::cross_entropy), else from logits.
// Written into `into` where given (logits' shape and dtype; logits itself may be), else into a
// new tensor.
Tensor cross_entropy_gradient(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                              int64_t classes, const Tensor& scale, const Tensor& stats = {},
                              const Tensor& into = {});
// The rows of targets that are not ignore_index, as an f64 scalar on their device: the mean's
// divisor, counted without waiting for the device.
Tensor cross_entropy_rows(const Tensor& targets, int64_t ignore_index);

}  // namespace pipit
