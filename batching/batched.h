#pragma once
// Wrapping modules, functions and constants for automatic batching (graph.h). A wrapped call
// made inside a Graph's scope records a node and returns Handles instead of running:
//   auto layer = batched(linear);                      // Module: forward on [k, ...]
//   auto add = batched_fn("add", pipit::add);          // any tensor function
//   auto cell = batched_fn<2>("lstm_cell", lstm_step);  // two outputs: auto [h, c] = cell(...)
//   Handle y = layer(add(batched_value(x), bias));
// A function gets each input position's batch (the calls' per-example inputs stacked along a
// new dim 0) and must return outputs with the batch as dim 0: row i is call i's result. Calls
// share a batch when they wrap the same object (the same parameters) and their inputs have
// the same per-example shapes and dtypes; `extra` adds anything else that must match.
#include <array>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "batching/graph.h"
#include "nn/module.h"

namespace pipit::batching {

template <int Outputs = 1>
class Batched {
 public:
  explicit Batched(std::shared_ptr<const Op> op) : op_(std::move(op)) {
    PIPIT_CHECK(op_->outputs == Outputs, "batching: op '", op_->name, "' has ", op_->outputs,
                " outputs, wrapped as ", Outputs);
  }

  template <typename... Inputs>
  auto operator()(const Inputs&... inputs) const {
    static_assert((std::is_convertible_v<Inputs, Handle> && ...), "batched calls take Handles");
    const std::array<Handle, sizeof...(Inputs)> in{inputs...};
    std::array<Handle, Outputs> out;
    graph().add(op_, in.data(), in.size(), out.data());
    if constexpr (Outputs == 1) {
      return out[0];
    } else {
      return out;
    }
  }
  // Inputs whose number is known only at run time (e.g. a sum over a node's children).
  auto call(const std::vector<Handle>& inputs) const {
    std::array<Handle, Outputs> out;
    graph().add(op_, inputs.data(), inputs.size(), out.data());
    if constexpr (Outputs == 1) {
      return out[0];
    } else {
      return out;
    }
  }
  const Op& op() const { return *op_; }

 private:
  Graph& graph() const {
    Graph* g = Graph::current();
    PIPIT_CHECK(g != nullptr, "batching: '", op_->name,
                "' was called outside a batching scope (hold a Graph's scope() while calling)");
    return *g;
  }
  std::shared_ptr<const Op> op_;
};

// The module's forward on each batch; calls of one module object share batches. `pure`: the
// same input gives the same output, so a repeated call is recorded once (false for modules
// with randomness, such as dropout while training).
Batched<1> batched(std::shared_ptr<Module> module, const std::string& name = "", bool pure = true);

// `function` takes either the input positions' batches as a std::vector<Tensor> and returns
// one std::vector<Tensor> (Outputs entries), or 1-3 Tensors and returns one Tensor.
template <int Outputs = 1, typename F>
Batched<Outputs> batched_fn(std::string name, F function, uint64_t extra = 0) {
  Op op;
  op.name = std::move(name);
  op.outputs = Outputs;
  op.extra = extra;
  using Batches = const std::vector<Tensor>&;
  if constexpr (std::is_invocable_r_v<std::vector<Tensor>, F, Batches>) {
    op.run = std::move(function);
  } else if constexpr (std::is_invocable_r_v<Tensor, F, const Tensor&>) {
    op.run = [f = std::move(function)](Batches in) { return std::vector<Tensor>{f(in.at(0))}; };
  } else if constexpr (std::is_invocable_r_v<Tensor, F, const Tensor&, const Tensor&>) {
    op.run = [f = std::move(function)](Batches in) {
      return std::vector<Tensor>{f(in.at(0), in.at(1))};
    };
  } else {
    static_assert(std::is_invocable_r_v<Tensor, F, const Tensor&, const Tensor&, const Tensor&>,
                  "batched_fn: the function takes std::vector<Tensor> or 1-3 Tensors");
    op.run = [f = std::move(function)](Batches in) {
      return std::vector<Tensor>{f(in.at(0), in.at(1), in.at(2))};
    };
  }
  return Batched<Outputs>(make_op(std::move(op)));
}

// A constant (an input, a parameter) for this scope's graph.
Handle batched_value(const Tensor& value);
// An integer constant (a token id, a label), as batched_value of an i64 scalar tensor but
// without making one: the graph writes it into a shared i64 batch, so consecutive indices are
// rows of one tensor and cost no allocation each.
Handle batched_index(int64_t index);

}  // namespace pipit::batching
