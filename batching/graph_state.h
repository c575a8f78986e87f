#pragma once
// The batching graph's storage, shared by Graph, Handle and the planner (internal: users see
// graph.h and handle.h). Nodes live in flat arrays: a node's inputs are a range of `inputs`,
// its results a row of one batch's outputs once it has run.
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "batching/op.h"

namespace pipit::batching {

struct NodeRef {
  int32_t node = -1;
  int32_t output = 0;
};

struct BatchNode {
  int32_t op = -1;  // index into GraphState::ops; -1: a value
  int32_t first_input = 0, input_count = 0;
  int32_t depth = 0;  // 0 for values, else 1 + the deepest input's
  int32_t key = -1;   // index into GraphState::key_ops, once its inputs have run
  int32_t handles = 0;
  int32_t batch = -1, row = 0;  // where its outputs are, once run
};

struct GraphState {
  std::vector<BatchNode> nodes;
  std::vector<NodeRef> inputs;
  std::vector<std::shared_ptr<const Op>> ops;
  std::unordered_map<uint64_t, int32_t> op_index;  // Op::id -> index into ops
  // A node's key: its op (and the op's extra) and the per-example shapes and dtypes of its
  // inputs, known once they have run. Interned: hash -> key.
  std::unordered_map<uint64_t, int32_t> key_ids;
  std::vector<int32_t> key_ops;              // key -> its op
  std::vector<std::vector<Tensor>> batches;  // outputs of each run batch, [k, ...]
  // The per-example shape and dtype of each batch output, hashed once when the batch is made
  // (keys are found from them for every node): batch b's outputs from signature_begin[b] on.
  std::vector<uint64_t> signatures;
  std::vector<int32_t> signature_begin;
  // Open addressing over pure op nodes; `tag`, the call's hash, rejects most other calls
  // without reading their nodes.
  struct ReuseSlot {
    uint32_t tag = 0;
    int32_t node = -1;
  };
  std::vector<ReuseSlot> reuse_slots;
  size_t reuse_used = 0;
  // Graph::index writes its scalars into rows of this batch ([capacity] i64) while they fit;
  // rows already read stay as they are.
  int32_t index_batch = -1;
  int64_t index_rows = 0;
  bool reuse = true;
  uint32_t generation = 0;  // clear() moves it on: older handles are stale
  // Every node below this has run, or is dead (no handle, no consumer that will run): the
  // planner looks only at the nodes from here on.
  int32_t planned_from = 0;
  // After Graph::merge, this graph's nodes live in `merged_into` from `node_offset` on.
  std::shared_ptr<GraphState> merged_into;
  int32_t node_offset = 0;
  uint32_t merged_generation = 0;

  // Follows merges; false when the handle's graph was cleared since it was made.
  static bool resolve(GraphState*& state, int32_t& node, uint32_t& generation);
  std::string describe(int32_t node) const;  // "node 12 (lstm_cell)"
  std::string key_name(int32_t key) const;   // "lstm_cell #3"
  // The key of `node`, whose inputs have all run (interned on first sight).
  int32_t key_of(int32_t node);
  // Appends a run batch's outputs ([k, ...] each); returns its index.
  int32_t add_batch(std::vector<Tensor> outputs);
  uint64_t signature(int32_t batch, int32_t output) const {
    return signatures[static_cast<size_t>(signature_begin[static_cast<size_t>(batch)] + output)];
  }
};

}  // namespace pipit::batching
