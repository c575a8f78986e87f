#include "tensor/kernel_layout.h"

#include "tensor/backend.h"

namespace pipit {

Tensor dense(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor out = Tensor::empty(t.shape(), t.dtype(), t.device());
  backend(t).copy(t, out);
  return out;
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

}  // namespace pipit
