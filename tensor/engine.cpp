// The backward engine behind Tensor::backward: runs the graph's nodes in dependency order,
// summing the gradients each node receives before it runs, and accumulating into leaves
// through AccumulateGrad. It lives in tensor/, which declares Tensor::backward, and knows
// nodes only through the Node interface; the differentiable ops are autograd/.
#include <unordered_map>

#include "tensor/backend.h"
#include "tensor/grad_mode.h"
#include "tensor/node.h"

namespace pipit {

namespace {
thread_local bool t_grad_enabled = true;

Tensor add_raw(const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  backend(a).binary(BinaryOp::add, a, b, out);
  return out;
}

void run_backward(const Tensor& root, const Tensor& grad) {
  PIPIT_CHECK(root.requires_grad(), "backward: the tensor does not require grad (shape ",
              shape_str(root.shape()), ")");
  PIPIT_CHECK(grad.shape() == root.shape(), "backward: gradient shape ", shape_str(grad.shape()),
              " differs from tensor shape ", shape_str(root.shape()));
  PIPIT_CHECK(grad.dtype() == root.dtype(), "backward: gradient dtype ", grad.dtype(),
              " differs from tensor dtype ", root.dtype());
  NoGradGuard no_grad;
  std::shared_ptr<Node> start = detail::gradient_edge(root);

  std::unordered_map<Node*, int> dependencies;
  std::vector<Node*> stack{start.get()};
  dependencies[start.get()] = 0;
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const auto& child : node->next) {
      if (!child) continue;
      auto [it, inserted] = dependencies.try_emplace(child.get(), 0);
      ++it->second;
      if (inserted) stack.push_back(child.get());
    }
  }

  std::unordered_map<Node*, Tensor> pending{{start.get(), grad}};
  std::vector<std::shared_ptr<Node>> ready{start};
  while (!ready.empty()) {
    std::shared_ptr<Node> node = std::move(ready.back());
    ready.pop_back();
    Tensor node_grad = std::move(pending[node.get()]);
    pending.erase(node.get());
    // A node that received no gradient passes none on, but still releases its children.
    std::vector<Tensor> input_grads = node_grad.defined() || node->runs_without_gradient()
                                          ? node->apply(node_grad)
                                          : std::vector<Tensor>(node->next.size());
    PIPIT_CHECK(input_grads.size() == node->next.size(), "backward: node ", node->name(),
                " returned ", input_grads.size(), " gradients for ", node->next.size(), " inputs");
    for (size_t i = 0; i < node->next.size(); ++i) {
      const std::shared_ptr<Node>& child = node->next[i];
      if (!child) continue;
      if (input_grads[i].defined()) {
        auto [it, inserted] = pending.try_emplace(child.get(), input_grads[i]);
        if (!inserted) {
          it->second = it->second.defined() ? add_raw(it->second, input_grads[i]) : input_grads[i];
        }
      }
      if (--dependencies[child.get()] == 0) ready.push_back(child);
    }
  }
}

}  // namespace

bool is_grad_enabled() {
  return t_grad_enabled;
}
void set_grad_enabled(bool enabled) {
  t_grad_enabled = enabled;
}

std::vector<Tensor> AccumulateGrad::apply(const Tensor& grad_output) {
  if (!grad_output.defined()) return {};
  if (!meta_->grad) {
    Tensor copy = Tensor::empty(grad_output.shape(), grad_output.dtype(), grad_output.device());
    backend(copy).copy(grad_output, copy);
    meta_->grad = std::make_shared<Tensor>(copy);
  } else {
    const Tensor& g = *meta_->grad;
    backend(g).binary(BinaryOp::add, g, grad_output, g);
  }
  return {};
}

namespace detail {
std::shared_ptr<Node> gradient_edge(const Tensor& input) {
  if (!input.requires_grad()) return nullptr;
  if (auto fn = input.grad_fn()) return fn;
  AutogradMeta& meta = const_cast<Tensor&>(input).autograd_meta();
  std::shared_ptr<Node> accumulator = meta.grad_accumulator.lock();
  if (!accumulator) {
    accumulator = std::make_shared<AccumulateGrad>(input.impl().autograd);
    meta.grad_accumulator = accumulator;
  }
  return accumulator;
}
}  // namespace detail

void Tensor::backward() const {
  PIPIT_CHECK(numel() == 1, "backward: called without a gradient on a tensor of shape ",
              shape_str(shape()), "; pass backward(grad) for non-scalar outputs");
  Tensor one = Tensor::empty(shape(), dtype(), device());
  backend(one).fill(one, 1.0);
  run_backward(*this, one);
}

void Tensor::backward(const Tensor& grad) const {
  run_backward(*this, grad);
}

}  // namespace pipit
