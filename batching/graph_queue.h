#pragma once
// GraphQueue: per-example graphs built on other threads, handed to the thread that runs them.
// A builder records its examples in a Graph of its own and pushes it with the handles it
// wants read; after the push it touches neither (handles count their uses in the graph,
// which now belongs to the executing thread). The executor pops what is queued, merges the
// graphs into one (Graph::merge) and runs them as one batch.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "batching/graph.h"

namespace pipit::batching {

struct BuiltGraph {
  std::unique_ptr<Graph> graph;
  std::vector<Handle> results;
  int64_t tag = 0;  // the builder's, e.g. which examples these are
};

class GraphQueue {
 public:
  explicit GraphQueue(size_t capacity = 64) : capacity_(capacity) {}

  // Blocks while the queue is full; throws once it is closed.
  void push(BuiltGraph built);
  // Waits for at least one graph, then takes up to `most` of those queued; empty when the
  // queue is closed and drained.
  std::vector<BuiltGraph> pop_some(size_t most);
  // No more pushes: pop_some drains what is left, then returns empty.
  void close();

 private:
  const size_t capacity_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<BuiltGraph> queue_;
  bool closed_ = false;
};

}  // namespace pipit::batching
