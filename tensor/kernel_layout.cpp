#include "tensor/kernel_layout.h"

#include <algorithm>

#include "tensor/backend.h"

namespace pipit {

Tensor dense(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor out = Tensor::empty(t.shape(), t.dtype(), t.device());
  backend(t).copy(t, out);
  return out;
}

Tensor unit_stride_rows(const Tensor& t) {
  if (t.dim() == 2 && t.strides()[1] == 1 && t.strides()[0] >= t.shape()[1]) return t;
  return dense(t);
}

Tensor dim_last(const Tensor& t, int64_t dim) {
  Shape shape = t.shape(), strides = t.strides();
  shape.erase(shape.begin() + dim);
  strides.erase(strides.begin() + dim);
  shape.push_back(t.shape()[dim]);
  strides.push_back(t.strides()[dim]);
  return Tensor::from_storage(t.storage(), shape, strides, t.offset(), t.dtype());
}

void check_causal_softmax(const char* op, const Tensor& scores, const Tensor& out) {
  const int64_t d = scores.dim();
  PIPIT_CHECK(d >= 2 && scores.shape()[d - 1] == scores.shape()[d - 2], op,
              ": expects scores [..., T, T], got ", shape_str(scores.shape()));
  PIPIT_CHECK(out.is_contiguous() && out.shape() == scores.shape(), op,
              ": output must be contiguous and shaped like the scores");
}

void check_cross_entropy_scale(const char* op, const Tensor& scale, const Tensor& logits) {
  const DType dtype = accumulate_dtype(logits.dtype());
  PIPIT_CHECK(scale.numel() == 1 && scale.dtype() == dtype && scale.device() == logits.device(), op,
              ": scale must be one ", dtype, " element on ", logits.device(), ", got ",
              shape_str(scale.shape()), " ", scale.dtype(), " on ", scale.device());
}

bool fits_layer_norm_residual(const Tensor& residual, const Tensor& x) {
  return residual.shape() == x.shape() && residual.dtype() == x.dtype() &&
         residual.is_contiguous() && residual.device() == x.device();
}

void check_layer_norm_residual(const char* op, const Tensor& residual, const Tensor& x) {
  if (!residual.defined()) return;
  PIPIT_CHECK(fits_layer_norm_residual(residual, x), op, ": residual must be contiguous ",
              x.dtype(), " ", shape_str(x.shape()), " on ", x.device(), ", got ",
              shape_str(residual.shape()), " ", residual.dtype(), " on ", residual.device(),
              residual.is_contiguous() ? "" : " (not contiguous)");
}

void check_cross_entropy_stats(const char* op, const Tensor& stats, const Tensor& logits) {
  if (!stats.defined()) return;
  const DType dtype = accumulate_dtype(logits.dtype());
  const Shape expected{logits.shape()[0], 2};
  PIPIT_CHECK(stats.shape() == expected && stats.dtype() == dtype && stats.is_contiguous() &&
                  stats.device() == logits.device(),
              op, ": stats must be contiguous ", dtype, " ", shape_str(expected), " on ",
              logits.device(), ", got ", shape_str(stats.shape()), " ", stats.dtype(), " on ",
              stats.device());
}

AttentionSizes check_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& lse, bool causal,
                               std::initializer_list<const Tensor*> outputs) {
  PIPIT_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op,
              ": expects q [B, H, Tq, D] and k, v [B, H, Tk, D], got ", shape_str(q.shape()), ", ",
              shape_str(k.shape()), ", ", shape_str(v.shape()));
  const AttentionSizes sizes{q.shape()[0], q.shape()[1], q.shape()[2], k.shape()[2], q.shape()[3]};
  const Shape kv{sizes.batch, sizes.heads, sizes.keys, sizes.head_dim};
  PIPIT_CHECK(k.shape() == kv && v.shape() == kv, op, ": k ", shape_str(k.shape()), " and v ",
              shape_str(v.shape()), " must both be ", shape_str(kv), " for q ",
              shape_str(q.shape()));
  PIPIT_CHECK(sizes.head_dim > 0, op, ": head dim must be positive");
  PIPIT_CHECK(!causal || sizes.queries <= sizes.keys, op, ": causal attention needs no more ",
              "queries than keys, got ", sizes.queries, " queries and ", sizes.keys, " keys");
  PIPIT_CHECK(sizes.keys > 0 || sizes.queries == 0 || sizes.batch * sizes.heads == 0, op,
              ": there are queries but no keys");
  PIPIT_CHECK(is_floating(q.dtype()) && k.dtype() == q.dtype() && v.dtype() == q.dtype(), op,
              ": q, k and v need one floating dtype, got ", q.dtype(), ", ", k.dtype(), ", ",
              v.dtype());
  PIPIT_CHECK(q.strides()[3] == 1 && k.strides()[3] == 1 && v.strides()[3] == 1, op,
              ": q, k and v need unit stride in the head dim");
  const Shape* expected[] = {&q.shape(), &kv, &kv};
  size_t index = 0;
  for (const Tensor* t : outputs) {
    const Shape& want = *expected[std::min<size_t>(index++, 2)];
    PIPIT_CHECK(t->shape() == want && t->dtype() == q.dtype() && t->strides()[3] == 1, op,
                ": output ", index - 1, " must be ", shape_str(want), " ", q.dtype(),
                " with unit stride in the head dim, got ", shape_str(t->shape()), " ", t->dtype());
  }
  const Shape lse_shape{sizes.batch, sizes.heads, sizes.queries};
  PIPIT_CHECK(
      lse.shape() == lse_shape && lse.is_contiguous() && lse.dtype() == accumulate_dtype(q.dtype()),
      op, ": lse must be a contiguous ", accumulate_dtype(q.dtype()), " ", shape_str(lse_shape));
  return sizes;
}

}  // namespace pipit
