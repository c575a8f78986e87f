// The backward engine behind Tensor::backward: runs the graph's nodes in dependency order,
// summing the gradients each node receives before it runs, and accumulating into leaves
// through AccumulateGrad. Tensor declares backward(); it is defined here, where the graph is,
// and knows nodes only through the Node interface.
#include <functional>
#include <unordered_map>
#include <unordered_set>

#include "autograd/accumulation_hook.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/split_backward.h"
#include "tensor/backend.h"

namespace pipit {

namespace {
thread_local bool t_grad_enabled = true;
thread_local GradientSums t_gradient_sums;

Tensor add_raw(const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  backend(a).binary(BinaryOp::add, a, b, out);
  return out;
}

void check_root(const Tensor& root, const Tensor& grad) {
  PIPIT_CHECK(root.requires_grad(), "backward: the tensor does not require grad (shape ",
              shape_str(root.shape()), ")");
  PIPIT_CHECK(grad.shape() == root.shape(), "backward: gradient shape ", shape_str(grad.shape()),
              " differs from tensor shape ", shape_str(root.shape()));
  PIPIT_CHECK(grad.dtype() == root.dtype(), "backward: gradient dtype ", grad.dtype(),
              " differs from tensor dtype ", root.dtype());
}

using Rooted = std::vector<std::pair<std::shared_ptr<Node>, Tensor>>;
// Which of a node's edges a propagation follows.
using Follows = std::function<bool(const Node& child)>;
// Computes a node's input gradients from the gradient it received, offered the gradients that
// wait for its inputs (Node::apply_adding).
using Apply = std::function<std::vector<Tensor>(const std::shared_ptr<Node>&, const Tensor&,
                                                std::vector<Tensor>& waiting)>;

std::vector<Tensor> apply_node(const std::shared_ptr<Node>& node, const Tensor& grad,
                               std::vector<Tensor>& waiting) {
  // A node that received no gradient passes none on, but still releases its children.
  if (grad.defined() || node->runs_without_gradient()) return node->apply_adding(grad, waiting);
  waiting.assign(waiting.size(), Tensor());
  return std::vector<Tensor>(node->next.size());
}

// Per node reachable from the roots over the edges `follows` admits: how many edges lead to it.
std::unordered_map<Node*, int> count_dependencies(const Rooted& roots, const Follows& follows) {
  std::unordered_map<Node*, int> dependencies;
  std::vector<Node*> stack;
  for (const auto& [root, grad] : roots) {
    if (dependencies.try_emplace(root.get(), 0).second) stack.push_back(root.get());
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const auto& child : node->next) {
      if (!child || !follows(*child)) continue;
      auto [it, inserted] = dependencies.try_emplace(child.get(), 0);
      ++it->second;
      if (inserted) stack.push_back(child.get());
    }
  }
  return dependencies;
}

// Runs nodes in dependency order from the roots over the edges `follows` admits, summing the
// gradients each node receives before it runs. No root may be reachable from another.
void propagate(Rooted roots, const Follows& follows, const Apply& apply) {
  std::unordered_map<Node*, int> dependencies = count_dependencies(roots, follows);
  t_gradient_sums = {};
  std::unordered_map<Node*, Tensor> pending;
  std::vector<std::shared_ptr<Node>> ready;
  // Reversed, so that the first root runs first.
  for (auto it = roots.rbegin(); it != roots.rend(); ++it) {
    pending[it->first.get()] = it->second;
    ready.push_back(it->first);
  }
  while (!ready.empty()) {
    std::shared_ptr<Node> node = std::move(ready.back());
    ready.pop_back();
    Tensor node_grad = std::move(pending[node.get()]);
    pending.erase(node.get());
    // An input's node that appears twice is offered its waiting gradient once, so that no
    // sum counts it twice.
    std::vector<Tensor> waiting(node->next.size());
    for (size_t i = 0; i < node->next.size(); ++i) {
      const std::shared_ptr<Node>& child = node->next[i];
      if (!child || !follows(*child)) continue;
      bool repeated = false;
      for (size_t j = 0; j < i; ++j) repeated = repeated || node->next[j] == child;
      auto it = pending.find(child.get());
      if (!repeated && it != pending.end()) waiting[i] = it->second;
    }
    std::vector<Tensor> input_grads = apply(node, node_grad, waiting);
    PIPIT_CHECK(input_grads.size() == node->next.size() && waiting.size() == node->next.size(),
                "backward: node ", node->name(), " returned ", input_grads.size(),
                " gradients for ", node->next.size(), " inputs");
    for (size_t i = 0; i < node->next.size(); ++i) {
      const std::shared_ptr<Node>& child = node->next[i];
      if (!child || !follows(*child)) continue;
      if (input_grads[i].defined() && waiting[i].defined()) {
        pending[child.get()] = input_grads[i];  // the node's sum of both
        ++t_gradient_sums.taken;
      } else if (input_grads[i].defined()) {
        auto [it, inserted] = pending.try_emplace(child.get(), input_grads[i]);
        if (!inserted && it->second.defined()) {
          it->second = add_raw(it->second, input_grads[i]);
          ++t_gradient_sums.separate;
        } else if (!inserted) {
          it->second = input_grads[i];
        }
      }
      if (--dependencies[child.get()] == 0) ready.push_back(child);
    }
  }
}

void run_backward(const Tensor& root, const Tensor& grad) {
  check_root(root, grad);
  NoGradGuard no_grad;
  propagate(
      {{detail::gradient_edge(root), grad}}, [](const Node&) { return true; }, apply_node);
}

// W's share of a node that computed it during B already: the gradients and where they go.
class ComputedGradients final : public Node {
 public:
  ComputedGradients(std::vector<Tensor> grads, std::vector<std::shared_ptr<Node>> edges)
      : grads_(std::move(grads)) {
    next = std::move(edges);
  }
  std::vector<Tensor> apply(const Tensor&) override { return std::move(grads_); }
  std::string name() const override { return "ComputedGradients"; }
  bool runs_without_gradient() const override { return true; }

 private:
  std::vector<Tensor> grads_;
};

// The nodes from which one of `targets` can be reached (targets included), found from `start`.
std::unordered_set<const Node*> nodes_leading_to(Node* start,
                                                 const std::unordered_set<const Node*>& targets) {
  std::unordered_map<const Node*, bool> leads;
  // Iterative post-order: a node is decided once all its children are.
  std::vector<std::pair<Node*, size_t>> stack{{start, 0}};
  leads[start] = targets.count(start) > 0;
  while (!stack.empty()) {
    auto& [node, next_child] = stack.back();
    if (next_child < node->next.size()) {
      Node* child = node->next[next_child++].get();
      if (child && leads.try_emplace(child, targets.count(child) > 0).second) {
        stack.push_back({child, 0});
      }
      continue;
    }
    bool any = leads[node];
    for (const auto& child : node->next) any = any || (child && leads[child.get()]);
    leads[node] = any;
    stack.pop_back();
  }
  std::unordered_set<const Node*> result;
  for (const auto& [node, yes] : leads) {
    if (yes) result.insert(node);
  }
  return result;
}

// What W does for a node B ran with its W edges hidden. A node that ignores missing edges
// (layer norm) computed its W gradients already: W keeps those instead of the node, its saved
// tensors and its gradient (all of them, or W asks the node again on g).
std::pair<std::shared_ptr<Node>, Tensor> weight_work(
    const std::shared_ptr<Node>& node, const Tensor& g, const std::vector<Tensor>& result,
    const std::vector<std::shared_ptr<Node>>& w_edges) {
  std::vector<Tensor> computed(w_edges.size());
  for (size_t i = 0; i < w_edges.size(); ++i) {
    if (!w_edges[i]) continue;
    if (i >= result.size() || !result[i].defined()) return {node, g};
    computed[i] = result[i];
  }
  return {std::make_shared<ComputedGradients>(std::move(computed), w_edges), Tensor()};
}

}  // namespace

DeferredGradients::~DeferredGradients() = default;

DeferredGradients backward_inputs_first(const Tensor& output, const Tensor& grad,
                                        const std::vector<Tensor>& inputs) {
  check_root(output, grad);
  NoGradGuard no_grad;
  std::shared_ptr<Node> start = detail::gradient_edge(output);
  std::unordered_set<const Node*> targets;
  // An input computed in the graph (not a leaf) receives its gradient in B, but what its own
  // node then does is W's.
  std::unordered_set<const Node*> computed_inputs;
  for (const Tensor& input : inputs) {
    if (auto edge = detail::gradient_edge(input)) {
      targets.insert(edge.get());
      if (input.grad_fn()) computed_inputs.insert(edge.get());
    }
  }
  const std::unordered_set<const Node*> on_path = nodes_leading_to(start.get(), targets);
  auto in_b = [&on_path](const Node& n) { return on_path.count(&n) > 0; };
  DeferredGradients deferred;
  std::vector<std::vector<std::shared_ptr<Node>>> w_edges_of;  // by deferred work
  if (!in_b(*start)) {
    deferred.work_.push_back({start, grad});
    return deferred;
  }
  // B: each node computes its input gradients; what it leaves to W is deferred.
  const Apply run_b = [&](const std::shared_ptr<Node>& node, const Tensor& g,
                          std::vector<Tensor>& waiting) {
    if (computed_inputs.count(node.get()) > 0) {
      deferred.work_.push_back({node, g});
      w_edges_of.push_back(node->next);
      waiting.assign(waiting.size(), Tensor());
      return std::vector<Tensor>(node->next.size());
    }
    // Hide the W edges while the node runs, so that it computes the B gradients only. Once B is
    // done the node keeps its W edges only, so the deferred work holds no more of the graph.
    std::vector<std::shared_ptr<Node>> w_edges(node->next.size());
    bool any_w = false;
    for (size_t i = 0; i < node->next.size(); ++i) {
      if (node->next[i] && !in_b(*node->next[i])) {
        w_edges[i] = std::move(node->next[i]);
        any_w = true;
      }
    }
    std::vector<Tensor> result = apply_node(node, g, waiting);
    if (!any_w) return result;
    auto [w_node, w_grad] = weight_work(node, g, result, w_edges);
    deferred.work_.push_back({std::move(w_node), std::move(w_grad)});
    w_edges_of.push_back(std::move(w_edges));
    return result;
  };
  propagate({{start, grad}}, in_b, run_b);
  for (size_t i = 0; i < w_edges_of.size(); ++i) deferred.work_[i].node->next = w_edges_of[i];
  return deferred;
}

void DeferredGradients::run() {
  NoGradGuard no_grad;
  Rooted roots;
  for (Work& work : work_) roots.emplace_back(std::move(work.node), std::move(work.grad));
  work_.clear();
  propagate(
      std::move(roots), [](const Node&) { return true; }, apply_node);
}

GradientSums last_gradient_sums() {
  return t_gradient_sums;
}

bool is_grad_enabled() {
  return t_grad_enabled;
}
void set_grad_enabled(bool enabled) {
  t_grad_enabled = enabled;
}

std::vector<Tensor> AccumulateGrad::apply(const Tensor& grad_output) {
  if (!grad_output.defined()) return {};
  if (!meta_->grad && grad_output.sole_owner()) {
    // Taken as it is, as torch's AccumulateGrad steals it: no copy of every gradient per step.
    meta_->grad = std::make_shared<Tensor>(grad_output);
  } else if (!meta_->grad) {
    Tensor copy = Tensor::empty(grad_output.shape(), grad_output.dtype(), grad_output.device());
    backend(copy).copy(grad_output, copy);
    meta_->grad = std::make_shared<Tensor>(copy);
  } else {
    const Tensor& g = *meta_->grad;
    backend(g).binary(BinaryOp::add, g, grad_output, g);
  }
  detail::gradient_accumulated(*meta_);
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
