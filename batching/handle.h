#pragma once
// Handle: the deferred result of a call recorded in a batching Graph (graph.h), or one output
// of it. Pass it to later calls; read it with value() once the graph has run. Handles keep
// their node alive: nodes no live handle needs (directly or through later calls) are pruned
// before running.
#include <cstdint>
#include <memory>
#include <vector>

#include "tensor/tensor.h"

namespace pipit::batching {

struct GraphState;

class Handle {
 public:
  Handle() = default;
  Handle(const Handle& other);
  Handle(Handle&& other) noexcept;
  Handle& operator=(Handle other) noexcept;
  ~Handle();

  bool defined() const { return state_ != nullptr; }
  // The result, a view of its batch's output (gradients flow back through it). Throws when
  // the graph has not run this node, was cleared, or is gone. To train on many results (every
  // example's loss), stack_values reads them with one gather and one gradient.
  Tensor value() const;
  // Whether the graph has run this node.
  bool ready() const;
  // "node 12 (lstm_cell)", for messages.
  std::string describe() const;
  // The node's index in its graph (after merges, in the graph it was merged into).
  int32_t node() const;
  int32_t output() const { return output_; }

 private:
  friend Tensor stack_values(const std::vector<Handle>& handles);
  friend struct GraphState;
  friend class Graph;
  Handle(std::shared_ptr<GraphState> state, int32_t node, int32_t output, uint32_t generation);
  void acquire() const;
  void release() const;

  std::shared_ptr<GraphState> state_;
  int32_t node_ = -1;
  int32_t output_ = 0;
  uint32_t generation_ = 0;
};

// The handles' values stacked along a new dim 0 with one gather (their graph has run them):
// e.g. every example's loss, to sum and train on. Differentiable, like value().
Tensor stack_values(const std::vector<Handle>& handles);

}  // namespace pipit::batching
