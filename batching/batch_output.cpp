#include "batching/batch_output.h"

#include "tensor/backend.h"
#include "tensor/factory.h"

namespace pipit::batching {

std::vector<Tensor> BatchOutputBackward::apply(const Tensor& grad_output) {
  Tensor sum = std::move(rows_gradient);
  rows_gradient = Tensor();
  if (!sum.defined()) return {grad_output};
  if (grad_output.defined()) backend(sum).binary(BinaryOp::add, sum, grad_output, sum);
  return {sum};
}

void BatchOutputBackward::add_row(const Shape& shape, int64_t row, const float* grad,
                                  int64_t width) {
  if (!rows_gradient.defined()) rows_gradient = zeros(shape);
  float* to = rows_gradient.data<float>() + row * width;
  for (int64_t i = 0; i < width; ++i) to[i] += grad[i];
}

Tensor expose_batch_output(const Tensor& output) {
  if (!output.requires_grad() || !is_grad_enabled()) return output;
  Tensor alias = output.detach();
  auto node = std::make_shared<BatchOutputBackward>();
  node->next.push_back(detail::gradient_edge(output));
  AutogradMeta& meta = alias.autograd_meta();
  meta.requires_grad = true;
  meta.grad_fn = node;
  return alias;
}

std::shared_ptr<BatchOutputBackward> batch_output_node(const Tensor& t) {
  if (!t.requires_grad()) return nullptr;
  return std::dynamic_pointer_cast<BatchOutputBackward>(t.grad_fn());
}

}  // namespace pipit::batching
