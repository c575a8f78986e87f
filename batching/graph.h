#pragma once
// Graph: automatic batching of dynamic computation graphs (DyNet's autobatching). Inside a
// graph's scope, calls to batched modules and functions (batched.h) do not run: each adds a
// node and returns a Handle. run() then executes the nodes in batches: nodes with the same
// key (the same op, the same per-example input shapes and dtypes, known once the inputs have
// run) whose inputs are ready run as one call on their inputs stacked along a new dim 0.
//   Graph graph;
//   auto scope = graph.scope();
//   Handle y = layer(batched_value(x));     // per example, in any control flow
//   graph.run();
//   Tensor out = y.value();                  // a view of its batch's output
// Which ready group runs next: Strategy::agenda (the group whose nodes have the smallest
// mean depth, DyNet's agenda-based strategy) or Strategy::depth (all nodes of one depth and
// key at a time). Nodes no live handle needs are pruned; a pure op called twice on the same
// inputs is recorded once. Autograd flows through everything: a sum of per-example losses
// trains as the per-example code would.
#include <cstdint>
#include <memory>
#include <vector>

#include "batching/handle.h"
#include "batching/op.h"

namespace pipit::batching {

enum class Strategy { agenda, depth };

struct GraphStats {
  int64_t nodes_run = 0, batches_run = 0;
  int64_t gathers = 0, views = 0;  // batch inputs copied by one gather, or passed as they were
  double plan_seconds = 0;         // scheduling: finding what to run, keys, the agenda
  double run_seconds = 0;          // executing batches: gathers and the ops' calls
};

class Graph {
 public:
  explicit Graph(bool reuse_repeated_calls = true);
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // While the returned object lives, batched calls on this thread record into this graph.
  class Scope {
   public:
    explicit Scope(Graph* graph);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Graph* previous_;
  };
  [[nodiscard]] Scope scope() { return Scope(this); }
  // The graph of this thread's innermost scope; null outside any.
  static Graph* current();

  // Records a call of `op` on `inputs`; fills `outputs` (op->outputs of them). Errors name
  // the op and the offending input.
  void add(const std::shared_ptr<const Op>& op, const Handle* inputs, size_t input_count,
           Handle* outputs);
  // A constant: already "run", a batch of its own.
  Handle value(const Tensor& tensor);
  // An i64 scalar constant: a row of the graph's current batch of indices.
  Handle index(int64_t index);

  // Runs every node a live handle needs. A call that throws fails the run with an error
  // naming the op's key and its first node; the nodes of earlier batches keep their values.
  void run(Strategy strategy = Strategy::agenda);
  // Drops every node; handles made before become stale (value() throws).
  void clear();
  // Moves `other`'s nodes into this graph (graphs built on other threads, run together);
  // other's handles now read from this graph. `other` is left empty.
  void merge(Graph& other);

  size_t size() const;
  const GraphStats& stats() const { return stats_; }
  // The batches the last run() executed, in order, as node ids (Handle::node()).
  const std::vector<std::vector<int32_t>>& last_batches() const { return last_batches_; }

 private:
  std::shared_ptr<GraphState> state_;
  GraphStats stats_;
  std::vector<std::vector<int32_t>> last_batches_;
};

}  // namespace pipit::batching
