#pragma once
// The autograd graph's core: the Node interface, AccumulateGrad, and make_node, the helper
// with which every differentiable op wires its result to its inputs. The engine that runs a
// graph is engine.cpp (behind Tensor::backward); the ops and their nodes are the other files
// of autograd/.
//
// A node, given dL/d(output), returns dL/d(input) for each input. next[i] is the node that
// receives input i's gradient (null when input i needs none).
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "tensor/tensor.h"

namespace pipit {

class Node {
 public:
  virtual ~Node() = default;
  // One entry per input; an undefined tensor means "no gradient".
  virtual std::vector<Tensor> apply(const Tensor& grad_output) = 0;
  virtual std::string name() const = 0;
  // A node whose gradient may also arrive by another way than its incoming edges (batching's
  // batch outputs, which gathers add rows into) is applied even when no edge brought one:
  // apply then gets an undefined grad_output.
  virtual bool runs_without_gradient() const { return false; }
  // As apply, offered the gradients that already wait for each input's node (`waiting`, one
  // entry per input, undefined where none): a node may add its own gradient into one as it
  // computes it, one pass instead of a separate sum. It returns that sum for the input and
  // leaves the entry; the entries it clears it did not add. The default adds none.
  virtual std::vector<Tensor> apply_adding(const Tensor& grad_output,
                                           std::vector<Tensor>& waiting) {
    waiting.assign(waiting.size(), Tensor());
    return apply(grad_output);
  }

  std::vector<std::shared_ptr<Node>> next;
};

// The node behind a leaf that requires grad: adds incoming gradients into the leaf's grad().
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<AutogradMeta> meta) : meta_(std::move(meta)) {}
  std::vector<Tensor> apply(const Tensor& grad_output) override;
  std::string name() const override { return "AccumulateGrad"; }

 private:
  std::shared_ptr<AutogradMeta> meta_;
};

// How the calling thread's last backward pass (or the last of its two parts, split) summed the
// gradients that met at a node: `separate` adds, and sums `taken` into a node's own pass.
struct GradientSums {
  int64_t separate = 0, taken = 0;
};
GradientSums last_gradient_sums();

namespace detail {

// The node that receives `input`'s gradient: its grad_fn, or for a leaf that requires grad
// its AccumulateGrad (created once, then shared); null when it requires none.
std::shared_ptr<Node> gradient_edge(const Tensor& input);

// For defining differentiable ops: creates the backward node of `out` and wires it to its
// inputs, or returns null when no input needs a gradient (or grad mode is off).
template <typename N>
std::shared_ptr<N> make_node(Tensor& out, std::initializer_list<Tensor> inputs) {
  if (!is_grad_enabled()) return nullptr;
  bool any = false;
  for (const Tensor& t : inputs) any = any || (t.defined() && t.requires_grad());
  if (!any) return nullptr;
  auto node = std::make_shared<N>();
  for (const Tensor& t : inputs) node->next.push_back(t.defined() ? gradient_edge(t) : nullptr);
  AutogradMeta& meta = out.autograd_meta();
  meta.requires_grad = true;
  meta.grad_fn = node;
  return node;
}

}  // namespace detail
}  // namespace pipit
