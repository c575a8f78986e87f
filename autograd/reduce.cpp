#include "autograd/reduce.h"

#include <algorithm>

#include "autograd/elementwise.h"
#include "autograd/node.h"
#include "autograd/shape_ops.h"
#include "tensor/backend.h"

namespace pipit {
namespace {

struct Reduction {
  std::vector<int64_t> dims;  // sorted, unique, non-negative
  Shape keep_shape;           // input shape with reduced dims set to 1
  Shape out_shape;            // keep_shape, or with reduced dims removed
  int64_t count = 1;          // elements reduced into each output
};

Reduction plan(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, const char* op) {
  Reduction r;
  if (dims.empty()) {
    for (int64_t d = 0; d < x.dim(); ++d) r.dims.push_back(d);
  } else {
    for (int64_t d : dims) r.dims.push_back(normalize_dim(d, x.dim(), op));
    std::sort(r.dims.begin(), r.dims.end());
    PIPIT_CHECK(std::adjacent_find(r.dims.begin(), r.dims.end()) == r.dims.end(), op,
                ": repeated dim in ", shape_str(dims));
  }
  r.keep_shape = x.shape();
  for (int64_t d : r.dims) {
    r.count *= x.shape()[d];
    r.keep_shape[d] = 1;
  }
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (keepdim || !std::binary_search(r.dims.begin(), r.dims.end(), d)) {
      r.out_shape.push_back(r.keep_shape[d]);
    }
  }
  return r;
}

Tensor reduce_raw(ReduceOp op, const Tensor& x, const Reduction& r, const char* name) {
  PIPIT_CHECK(op == ReduceOp::sum || r.count > 0, name, ": cannot reduce an empty dim of shape ",
              shape_str(x.shape()));
  Tensor out = Tensor::empty(r.keep_shape, x.dtype(), x.device());
  backend(x).reduce(op, x, r.dims, out);
  return Tensor::from_storage(out.storage(), r.out_shape, contiguous_strides(r.out_shape), 0,
                              out.dtype());
}

struct SumBackward : Node {
  Shape input_shape, keep_shape;
  std::vector<Tensor> apply(const Tensor& g) override {
    return {expand(reshape(g, keep_shape), input_shape)};
  }
  std::string name() const override { return "SumBackward"; }
};

struct ExtremumBackward : Node {
  Tensor input, result;  // result in keep_shape
  std::vector<Tensor> apply(const Tensor& g) override {
    Tensor mask = eq(input, result).to(input.dtype());
    Tensor ties = sum_to(mask, result.shape());
    return {mul(mask, div(reshape(g, result.shape()), ties))};
  }
  std::string name() const override { return "ExtremumBackward"; }
};

Tensor extremum(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim,
                const char* name) {
  Reduction r = plan(x, dims, keepdim, name);
  Tensor out = reduce_raw(op, x, r, name);
  if (auto node = detail::make_node<ExtremumBackward>(out, {x})) {
    node->input = x.detach();
    node->result = Tensor::from_storage(out.storage(), r.keep_shape,
                                        contiguous_strides(r.keep_shape), 0, out.dtype());
  }
  return out;
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  Reduction r = plan(x, dims, keepdim, "sum");
  Tensor out = reduce_raw(ReduceOp::sum, x, r, "sum");
  if (auto node = detail::make_node<SumBackward>(out, {x})) {
    node->input_shape = x.shape();
    node->keep_shape = r.keep_shape;
  }
  return out;
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  Reduction r = plan(x, dims, keepdim, "mean");
  PIPIT_CHECK(is_floating(x.dtype()), "mean: needs a floating dtype, got ", x.dtype());
  return sum(x, dims, keepdim) * (1.0 / static_cast<double>(r.count));
}

Tensor max(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extremum(ReduceOp::max, x, dims, keepdim, "max");
}

Tensor min(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extremum(ReduceOp::min, x, dims, keepdim, "min");
}

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, int64_t correction) {
  Reduction r = plan(x, dims, keepdim, "var");
  PIPIT_CHECK(r.count - correction > 0, "var: ", r.count, " elements are too few for correction ",
              correction);
  Tensor centered = x - mean(x, dims, true);
  return sum(centered * centered, dims, keepdim) *
         (1.0 / static_cast<double>(r.count - correction));
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  int64_t d = normalize_dim(dim, x.dim(), "argmax");
  PIPIT_CHECK(x.shape()[d] > 0, "argmax: dim ", d, " of shape ", shape_str(x.shape()), " is empty");
  Shape keep = x.shape();
  keep[d] = 1;
  Tensor out = Tensor::empty(keep, DType::i64, x.device());
  backend(x).argmax(x, d, out);
  if (keepdim) return out;
  Shape squeezed = x.shape();
  squeezed.erase(squeezed.begin() + d);
  return Tensor::from_storage(out.storage(), squeezed, contiguous_strides(squeezed), 0, DType::i64);
}

}  // namespace pipit
