#pragma once
// Layout helpers the backends' kernels share. No autograd: the differentiable forms are
// Tensor::contiguous and the view ops in autograd/.
#include <cstdint>
#include <initializer_list>

#include "tensor/tensor.h"

namespace pipit {

// t itself when contiguous, else a contiguous copy on t's device.
Tensor dense(const Tensor& t);
// A 2-D t as rows of unit stride, evenly spaced (strides()[0] apart): t itself when it is so
// (a narrowed view of wider rows is), else a contiguous copy.
Tensor unit_stride_rows(const Tensor& t);
// A view of t with `dim` moved last.
Tensor dim_last(const Tensor& t, int64_t dim);
// What Backend::causal_softmax and its backward need: square scores [..., T, T] and a
// contiguous output of their shape.
void check_causal_softmax(const char* op, const Tensor& scores, const Tensor& out);

// The sizes of a Backend::attention call, after checking q [B, H, Tq, D], k and v [B, H, Tk, D]
// (unit stride in D), one floating dtype, `outputs` shaped like q (and then k, v, for the
// backward's gradients) with unit stride in D, lse a contiguous [B, H, Tq] of
// accumulate_dtype(q's dtype), and with `causal` no more queries than keys.
struct AttentionSizes {
  int64_t batch, heads, queries, keys, head_dim;
};
AttentionSizes check_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& lse, bool causal,
                               std::initializer_list<const Tensor*> outputs);
// What Backend::cross_entropy_backward needs of its scale: one element of
// accumulate_dtype(the logits' dtype) on their device.
void check_cross_entropy_scale(const char* op, const Tensor& scale, const Tensor& logits);
// What layer_norm_backward needs of its residual: undefined, or contiguous with x's shape,
// dtype and device (fits_layer_norm_residual, for a caller that would rather not pass it).
bool fits_layer_norm_residual(const Tensor& residual, const Tensor& x);
void check_layer_norm_residual(const char* op, const Tensor& residual, const Tensor& x);
// What cross_entropy and its backward need of the row statistics: undefined, or [N, 2]
// contiguous in accumulate_dtype(the logits' dtype) on their device.
void check_cross_entropy_stats(const char* op, const Tensor& stats, const Tensor& logits);

}  // namespace pipit
