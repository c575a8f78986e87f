#include "batching/gather_rows.h"

#include <cstring>

#include "autograd/node.h"
#include "batching/batch_output.h"
#include "tensor/factory.h"

namespace pipit::batching {
namespace {

size_t row_bytes(const Tensor& t) {
  return t.size(0) == 0 ? 0 : t.nbytes() / static_cast<size_t>(t.size(0));
}

// Adds the result's gradient rows back where they came from: into the batch outputs' shared
// row gradients (batch_output.h), or into zero gradients shaped like the other sources.
struct GatherRowsBackward : Node {
  std::vector<Shape> shapes;
  std::vector<std::shared_ptr<BatchOutputBackward>> collectors;  // per source, or null
  std::vector<RowRef> rows;
  std::vector<Tensor> apply(const Tensor& grad) override {
    const Tensor g = grad.contiguous();
    std::vector<Tensor> out(shapes.size());
    for (size_t s = 0; s < shapes.size(); ++s) {
      if (!collectors[s] && next[s]) out[s] = zeros(shapes[s], {g.dtype(), g.device()});
    }
    const int64_t width = g.size(0) == 0 ? 0 : g.numel() / g.size(0);
    const float* from = g.data<float>();
    for (size_t r = 0; r < rows.size(); ++r) {
      const size_t source = static_cast<size_t>(rows[r].source);
      const float* row = from + static_cast<int64_t>(r) * width;
      if (collectors[source]) {
        collectors[source]->add_row(shapes[source], rows[r].row, row, width);
      } else if (out[source].defined()) {
        float* to = out[source].data<float>() + rows[r].row * width;
        for (int64_t i = 0; i < width; ++i) to[i] += row[i];
      }
    }
    return out;
  }
  std::string name() const override { return "GatherRowsBackward"; }
};

// Other devices and dtypes: the sources side by side, then one embedding lookup.
Tensor gather_by_embedding(const std::vector<Tensor>& sources, const std::vector<RowRef>& rows) {
  std::vector<int64_t> offsets(sources.size(), 0);
  std::vector<Tensor> flat;
  int64_t total = 0;
  for (size_t s = 0; s < sources.size(); ++s) {
    offsets[s] = total;
    total += sources[s].size(0);
    flat.push_back(reshape(sources[s], {sources[s].size(0), -1}));
  }
  std::vector<int64_t> index;
  index.reserve(rows.size());
  for (const RowRef& r : rows) index.push_back(offsets[static_cast<size_t>(r.source)] + r.row);
  Tensor picked =
      embedding(cat(flat, 0),
                from_vector(index, {static_cast<int64_t>(index.size())}).to(sources[0].device()));
  Shape shape = sources[0].shape();
  shape[0] = static_cast<int64_t>(rows.size());
  return reshape(picked, shape);
}

}  // namespace

Tensor gather_rows(const std::vector<Tensor>& sources, const std::vector<RowRef>& rows) {
  PIPIT_CHECK(!sources.empty(), "gather_rows: no sources");
  const Tensor& first = sources[0];
  for (const Tensor& s : sources) {
    PIPIT_CHECK(s.dim() >= 1 && s.dtype() == first.dtype() && s.device() == first.device() &&
                    Shape(s.shape().begin() + 1, s.shape().end()) ==
                        Shape(first.shape().begin() + 1, first.shape().end()),
                "gather_rows: sources of shapes ", shape_str(first.shape()), " and ",
                shape_str(s.shape()), " (", first.dtype(), ", ", s.dtype(),
                ") cannot be gathered into one batch");
  }
  for (const RowRef& r : rows) {
    PIPIT_CHECK(r.source >= 0 && static_cast<size_t>(r.source) < sources.size() && r.row >= 0 &&
                    r.row < sources[static_cast<size_t>(r.source)].size(0),
                "gather_rows: row ", r.row, " of source ", r.source, " is out of range");
  }
  bool any_grad = false;
  for (const Tensor& s : sources) any_grad = any_grad || s.requires_grad();
  any_grad = any_grad && is_grad_enabled();
  // Row copies on the CPU, and gradients for f32; the rest through cat and embedding.
  if (!first.device().is_cpu() || (any_grad && first.dtype() != DType::f32)) {
    return gather_by_embedding(sources, rows);
  }
  std::vector<Tensor> contiguous;
  for (const Tensor& s : sources) contiguous.push_back(s.detach().contiguous());
  Shape shape = first.shape();
  shape[0] = static_cast<int64_t>(rows.size());
  Tensor out = Tensor::empty(shape, first.dtype(), first.device());
  const size_t bytes = row_bytes(contiguous[0]);
  auto* to = static_cast<char*>(out.raw_data());
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto* from =
        static_cast<const char*>(contiguous[static_cast<size_t>(rows[r].source)].raw_data());
    std::memcpy(to + r * bytes, from + static_cast<size_t>(rows[r].row) * bytes, bytes);
  }
  if (any_grad) {
    auto node = std::make_shared<GatherRowsBackward>();
    for (const Tensor& s : sources) {
      node->next.push_back(s.requires_grad() ? detail::gradient_edge(s) : nullptr);
      node->shapes.push_back(s.shape());
      node->collectors.push_back(batch_output_node(s));
    }
    node->rows = rows;
    AutogradMeta& meta = out.autograd_meta();
    meta.requires_grad = true;
    meta.grad_fn = node;
  }
  return out;
}

}  // namespace pipit::batching
