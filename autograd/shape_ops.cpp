#include "autograd/shape_ops.h"

#include <numeric>
#include <optional>

#include "autograd/node.h"
#include "autograd/reduce.h"
#include "tensor/backend.h"
#include "tensor/factory.h"

namespace pipit {
namespace {

Tensor make_view(const Tensor& x, Shape shape, Shape strides, int64_t offset) {
  return Tensor::from_storage(x.storage(), std::move(shape), std::move(strides), offset, x.dtype());
}

// A contiguous copy of x on its device, outside the graph (reshape's node covers it).
Tensor dense_copy(const Tensor& x) {
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  backend(x).copy(x, out);
  return out;
}

// Strides that let `shape` view x's memory, if any (the algorithm PyTorch uses for view).
std::optional<Shape> view_strides(const Tensor& x, const Shape& shape) {
  if (x.numel() == 0 || x.dim() == 0 || x.is_contiguous()) return contiguous_strides(shape);
  const Shape& old_shape = x.shape();
  const Shape& old_strides = x.strides();
  Shape strides(shape.size(), 1);
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = x.dim() - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    if (d == 0 ||
        (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return strides;
}

Shape infer_shape(const Tensor& x, Shape shape, const char* op) {
  int64_t known = 1, infer = -1;
  bool has_zero = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      PIPIT_CHECK(infer < 0, op, ": more than one -1 in shape ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      PIPIT_CHECK(shape[i] >= 0, op, ": invalid size in shape ", shape_str(shape));
      // Zeros kept out of the product, which must fit whatever they are (see check_shape).
      has_zero = has_zero || shape[i] == 0;
      PIPIT_CHECK(shape[i] == 0 || !__builtin_mul_overflow(known, shape[i], &known), op, ": shape ",
                  shape_str(shape), " is too large: the product of its dimensions overflows int64");
    }
  }
  if (infer >= 0) {
    PIPIT_CHECK(!has_zero && x.numel() % known == 0, op, ": cannot reshape tensor of shape ",
                shape_str(x.shape()), " into ", shape_str(shape));
    shape[infer] = x.numel() / known;
  }
  PIPIT_CHECK(shape_numel(shape) == x.numel(), op, ": cannot reshape tensor of shape ",
              shape_str(x.shape()), " (", x.numel(), " elements) into ", shape_str(shape));
  return shape;
}

struct ReshapeBackward : Node {
  Shape input_shape;
  std::vector<Tensor> apply(const Tensor& g) override { return {reshape(g, input_shape)}; }
  std::string name() const override { return "ReshapeBackward"; }
};

struct PermuteBackward : Node {
  std::vector<int64_t> inverse;
  std::vector<Tensor> apply(const Tensor& g) override { return {permute(g, inverse)}; }
  std::string name() const override { return "PermuteBackward"; }
};

struct SliceBackward : Node {
  Shape input_shape;
  int64_t dim = 0, start = 0, end = 0, step = 1;
  std::vector<Tensor> apply(const Tensor& g) override {
    Tensor out = zeros(input_shape, {g.dtype(), g.device()});
    backend(g).copy(g, slice(out, dim, start, end, step));
    return {out};
  }
  std::string name() const override { return "SliceBackward"; }
};

struct ExpandBackward : Node {
  Shape input_shape;
  std::vector<Tensor> apply(const Tensor& g) override { return {sum_to(g, input_shape)}; }
  std::string name() const override { return "ExpandBackward"; }
};

struct CatBackward : Node {
  int64_t dim = 0;
  std::vector<int64_t> sizes;
  std::vector<Tensor> apply(const Tensor& g) override {
    std::vector<Tensor> grads;
    int64_t start = 0;
    for (int64_t size : sizes) {
      grads.push_back(narrow(g, dim, start, size));
      start += size;
    }
    return grads;
  }
  std::string name() const override { return "CatBackward"; }
};

}  // namespace

Tensor reshape(const Tensor& x, Shape shape) {
  shape = infer_shape(x, std::move(shape), "reshape");
  std::optional<Shape> strides = view_strides(x, shape);
  Tensor out = strides ? make_view(x, shape, *strides, x.offset())
                       : make_view(dense_copy(x), shape, contiguous_strides(shape), 0);
  if (auto node = detail::make_node<ReshapeBackward>(out, {x})) node->input_shape = x.shape();
  return out;
}

Tensor view(const Tensor& x, Shape shape) {
  shape = infer_shape(x, std::move(shape), "view");
  PIPIT_CHECK(view_strides(x, shape).has_value(), "view: a tensor of shape ", shape_str(x.shape()),
              " and strides ", shape_str(x.strides()), " cannot be viewed as ", shape_str(shape),
              "; use reshape");
  return reshape(x, shape);
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  if (x.dim() == 0) return reshape(x, {1});
  int64_t s = normalize_dim(start_dim, x.dim(), "flatten");
  int64_t e = normalize_dim(end_dim, x.dim(), "flatten");
  PIPIT_CHECK(s <= e, "flatten: start_dim ", start_dim, " is after end_dim ", end_dim);
  Shape shape(x.shape().begin(), x.shape().begin() + s);
  int64_t merged = 1;
  for (int64_t d = s; d <= e; ++d) merged *= x.shape()[d];
  shape.push_back(merged);
  shape.insert(shape.end(), x.shape().begin() + e + 1, x.shape().end());
  return reshape(x, shape);
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  PIPIT_CHECK(static_cast<int64_t>(dims.size()) == x.dim(), "permute: ", dims.size(),
              " dims given for a tensor of rank ", x.dim());
  Shape shape, strides;
  std::vector<int64_t> inverse(dims.size(), -1);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = normalize_dim(dims[i], x.dim(), "permute");
    PIPIT_CHECK(inverse[d] < 0, "permute: dim ", d, " repeated in ", shape_str(dims));
    inverse[d] = static_cast<int64_t>(i);
    shape.push_back(x.shape()[d]);
    strides.push_back(x.strides()[d]);
  }
  Tensor out = make_view(x, shape, strides, x.offset());
  if (auto node = detail::make_node<PermuteBackward>(out, {x})) node->inverse = inverse;
  return out;
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  std::vector<int64_t> dims(static_cast<size_t>(x.dim()));
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[normalize_dim(dim0, x.dim(), "transpose")],
            dims[normalize_dim(dim1, x.dim(), "transpose")]);
  return permute(x, dims);
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  int64_t d = normalize_dim(dim, x.dim(), "slice");
  const int64_t size = x.shape()[d];
  PIPIT_CHECK(step >= 1, "slice: step must be >= 1, got ", step);
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::clamp<int64_t>(start, 0, size);
  end = std::clamp<int64_t>(end, start, size);
  Shape shape = x.shape(), strides = x.strides();
  shape[d] = (end - start + step - 1) / step;
  strides[d] *= step;
  Tensor out = make_view(x, shape, strides, x.offset() + start * x.strides()[d]);
  if (auto node = detail::make_node<SliceBackward>(out, {x})) {
    node->input_shape = x.shape();
    node->dim = d;
    node->start = start;
    node->end = end;
    node->step = step;
  }
  return out;
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  int64_t d = normalize_dim(dim, x.dim(), "narrow");
  PIPIT_CHECK(start >= 0 && length >= 0 && start + length <= x.shape()[d], "narrow: range [", start,
              ", ", start + length, ") is outside dim ", d, " of size ", x.shape()[d], " (shape ",
              shape_str(x.shape()), ")");
  return slice(x, d, start, start + length);
}

Tensor expand(const Tensor& x, const Shape& shape) {
  PIPIT_CHECK(static_cast<int64_t>(shape.size()) >= x.dim(), "expand: cannot expand shape ",
              shape_str(x.shape()), " to fewer dims ", shape_str(shape));
  const size_t lead = shape.size() - static_cast<size_t>(x.dim());
  Shape out_shape(shape.size()), strides(shape.size(), 0);
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      PIPIT_CHECK(shape[i] >= 0, "expand: -1 not allowed for new leading dims in ",
                  shape_str(shape));
      out_shape[i] = shape[i];
      continue;
    }
    int64_t have = x.shape()[i - lead];
    int64_t want = shape[i] == -1 ? have : shape[i];
    PIPIT_CHECK(have == want || have == 1, "expand: shape ", shape_str(x.shape()),
                " cannot be expanded to ", shape_str(shape));
    out_shape[i] = want;
    strides[i] = have == want ? x.strides()[i - lead] : 0;
  }
  if (out_shape == x.shape()) return x;
  Tensor out = make_view(x, out_shape, strides, x.offset());
  if (auto node = detail::make_node<ExpandBackward>(out, {x})) node->input_shape = x.shape();
  return out;
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  int64_t d = normalize_dim(dim, x.dim(), "squeeze");
  if (x.shape()[d] != 1) return x;
  Shape shape = x.shape();
  shape.erase(shape.begin() + d);
  return reshape(x, shape);
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  int64_t d = normalize_dim(dim, x.dim() + 1, "unsqueeze");
  Shape shape = x.shape();
  shape.insert(shape.begin() + d, 1);
  return reshape(x, shape);
}

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  PIPIT_CHECK(!xs.empty(), "cat: no tensors given");
  const Tensor& first = xs[0];
  int64_t d = normalize_dim(dim, first.dim(), "cat");
  Shape shape = first.shape();
  shape[d] = 0;
  for (const Tensor& t : xs) {
    Shape expect = first.shape();
    expect[d] = t.dim() == first.dim() ? t.shape()[d] : -1;
    PIPIT_CHECK(t.shape() == expect && t.dtype() == first.dtype(), "cat: tensor of shape ",
                shape_str(t.shape()), " and dtype ", t.dtype(), " does not match shape ",
                shape_str(first.shape()), " and dtype ", first.dtype(), " outside dim ", d);
    shape[d] += t.shape()[d];
  }
  Tensor out = Tensor::empty(shape, first.dtype(), first.device());
  std::vector<int64_t> sizes;
  int64_t start = 0;
  {
    NoGradGuard no_grad;
    for (const Tensor& t : xs) {
      backend(out).copy(t, narrow(out, d, start, t.shape()[d]));
      start += t.shape()[d];
      sizes.push_back(t.shape()[d]);
    }
  }
  if (is_grad_enabled()) {
    bool any = false;
    for (const Tensor& t : xs) any = any || t.requires_grad();
    if (any) {
      auto node = std::make_shared<CatBackward>();
      node->dim = d;
      node->sizes = sizes;
      for (const Tensor& t : xs) node->next.push_back(detail::gradient_edge(t));
      out.autograd_meta().requires_grad = true;
      out.autograd_meta().grad_fn = node;
    }
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& xs, int64_t dim) {
  PIPIT_CHECK(!xs.empty(), "stack: no tensors given");
  int64_t d = normalize_dim(dim, xs[0].dim() + 1, "stack");
  std::vector<Tensor> expanded;
  for (const Tensor& t : xs) {
    PIPIT_CHECK(t.shape() == xs[0].shape(), "stack: shapes ", shape_str(t.shape()), " and ",
                shape_str(xs[0].shape()), " differ");
    expanded.push_back(unsqueeze(t, d));
  }
  return cat(expanded, d);
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  int64_t d = normalize_dim(dim, x.dim(), "split");
  PIPIT_CHECK(split_size > 0, "split: split_size must be positive, got ", split_size);
  std::vector<Tensor> parts;
  for (int64_t start = 0; start < x.shape()[d]; start += split_size) {
    parts.push_back(narrow(x, d, start, std::min(split_size, x.shape()[d] - start)));
  }
  return parts;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  int64_t d = normalize_dim(dim, x.dim(), "chunk");
  PIPIT_CHECK(chunks > 0, "chunk: chunks must be positive, got ", chunks);
  return split(x, std::max<int64_t>(1, (x.shape()[d] + chunks - 1) / chunks), d);
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  const size_t lead = x.shape().size() - shape.size();
  std::vector<int64_t> dims;
  for (size_t i = 0; i < x.shape().size(); ++i) {
    if (i < lead || (shape[i - lead] == 1 && x.shape()[i] != 1)) {
      dims.push_back(static_cast<int64_t>(i));
    }
  }
  return reshape(sum(x, dims, true), shape);
}

}  // namespace pipit
