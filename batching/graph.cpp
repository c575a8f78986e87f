#include "batching/graph.h"

#include <atomic>
#include <chrono>

#include "autograd/ops.h"
#include "batching/gather_rows.h"
#include "batching/graph_state.h"

namespace pipit::batching {
namespace {

thread_local Graph* current_graph = nullptr;

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdULL;
}

// The reuse table's hash of a call: the op and exactly which results it takes. Its high half
// (a product's best-mixed bits) is the slot's tag and picks the slot, so the table grows
// without reading nodes.
uint32_t call_tag(int32_t op, const NodeRef* refs, int32_t count) {
  uint64_t h = mix(0x63616c6cULL, static_cast<uint64_t>(op));
  for (int32_t i = 0; i < count; ++i) {
    h = mix(h, static_cast<uint64_t>(refs[i].node) << 8 | static_cast<uint64_t>(refs[i].output));
  }
  return static_cast<uint32_t>(h >> 32);
}

bool same_call(const GraphState& s, const BatchNode& n, int32_t op, const NodeRef* refs,
               int32_t count) {
  if (n.op != op || n.input_count != count) return false;
  for (int32_t i = 0; i < count; ++i) {
    const NodeRef& a = s.inputs[static_cast<size_t>(n.first_input + i)];
    if (a.node != refs[i].node || a.output != refs[i].output) return false;
  }
  return true;
}

void grow_reuse_table(GraphState& s) {
  std::vector<GraphState::ReuseSlot> old = std::move(s.reuse_slots);
  s.reuse_slots.assign(old.empty() ? 1024 : old.size() * 2, {});
  const size_t mask = s.reuse_slots.size() - 1;
  for (const GraphState::ReuseSlot& entry : old) {
    if (entry.node < 0) continue;
    size_t slot = entry.tag & mask;
    while (s.reuse_slots[slot].node >= 0) slot = (slot + 1) & mask;
    s.reuse_slots[slot] = entry;
  }
}

uint64_t signature_of(const Tensor& batch) {
  uint64_t h = mix(static_cast<uint64_t>(batch.dtype()), static_cast<uint64_t>(batch.dim()));
  for (int64_t d = 1; d < batch.dim(); ++d) h = mix(h, static_cast<uint64_t>(batch.size(d)));
  return h;
}

// The node of an earlier call of the same pure op on the same inputs, or -1 after reserving
// its slot in the reuse table for the node about to be added.
int32_t reuse_call(GraphState& s, int32_t op_index, const NodeRef* refs, int32_t count) {
  if (2 * (s.reuse_used + 1) > s.reuse_slots.size()) grow_reuse_table(s);
  const size_t mask = s.reuse_slots.size() - 1;
  const uint32_t tag = call_tag(op_index, refs, count);
  size_t slot = tag & mask;
  for (; s.reuse_slots[slot].node >= 0; slot = (slot + 1) & mask) {
    const GraphState::ReuseSlot& entry = s.reuse_slots[slot];
    if (entry.tag == tag &&
        same_call(s, s.nodes[static_cast<size_t>(entry.node)], op_index, refs, count)) {
      return entry.node;
    }
  }
  s.reuse_slots[slot] = {tag, static_cast<int32_t>(s.nodes.size())};
  ++s.reuse_used;
  return -1;
}

}  // namespace

int32_t GraphState::key_of(int32_t node) {
  const BatchNode& n = nodes[static_cast<size_t>(node)];
  const Op& op = *ops[static_cast<size_t>(n.op)];
  uint64_t h = mix(op.id, op.extra);
  for (int32_t i = 0; i < n.input_count; ++i) {
    const NodeRef& ref = inputs[static_cast<size_t>(n.first_input + i)];
    h = mix(h, signature(nodes[static_cast<size_t>(ref.node)].batch, ref.output));
  }
  auto [it, added] = key_ids.try_emplace(h, static_cast<int32_t>(key_ops.size()));
  if (added) key_ops.push_back(n.op);
  return it->second;
}

int32_t GraphState::add_batch(std::vector<Tensor> outputs) {
  signature_begin.push_back(static_cast<int32_t>(signatures.size()));
  for (const Tensor& output : outputs) signatures.push_back(signature_of(output));
  batches.push_back(std::move(outputs));
  return static_cast<int32_t>(batches.size() - 1);
}

std::shared_ptr<const Op> make_op(Op op) {
  static std::atomic<uint64_t> next_id{1};
  PIPIT_CHECK(op.run, "batching: op '", op.name, "' has nothing to run");
  PIPIT_CHECK(op.outputs >= 1, "batching: op '", op.name, "' must have at least one output");
  op.id = next_id++;
  return std::make_shared<const Op>(std::move(op));
}

Graph::Scope::Scope(Graph* graph) : previous_(current_graph) {
  current_graph = graph;
}
Graph::Scope::~Scope() {
  current_graph = previous_;
}
Graph* Graph::current() {
  return current_graph;
}

Graph::Graph(bool reuse_repeated_calls) : state_(std::make_shared<GraphState>()) {
  state_->reuse = reuse_repeated_calls;
}
Graph::~Graph() {
  // Handles that outlive the graph find it cleared.
  ++state_->generation;
}

size_t Graph::size() const {
  return state_->nodes.size();
}

Handle Graph::value(const Tensor& tensor) {
  PIPIT_CHECK(tensor.defined(), "batching: batched_value of an undefined tensor");
  GraphState& s = *state_;
  BatchNode n;
  n.batch = s.add_batch({unsqueeze(tensor, 0)});
  s.nodes.push_back(n);
  return Handle(state_, static_cast<int32_t>(s.nodes.size() - 1), 0, s.generation);
}

Handle Graph::index(int64_t index) {
  constexpr int64_t kIndexRows = 1024;
  GraphState& s = *state_;
  if (s.index_batch < 0 || s.index_rows == kIndexRows) {
    s.index_batch = s.add_batch({Tensor::empty({kIndexRows}, DType::i64)});
    s.index_rows = 0;
  }
  s.batches[static_cast<size_t>(s.index_batch)][0].data<int64_t>()[s.index_rows] = index;
  BatchNode n;
  n.batch = s.index_batch;
  n.row = static_cast<int32_t>(s.index_rows++);
  s.nodes.push_back(n);
  return Handle(state_, static_cast<int32_t>(s.nodes.size() - 1), 0, s.generation);
}

void Graph::add(const std::shared_ptr<const Op>& op, const Handle* inputs, size_t input_count,
                Handle* outputs) {
  GraphState& s = *state_;
  auto [index_it, new_op] = s.op_index.try_emplace(op->id, static_cast<int32_t>(s.ops.size()));
  if (new_op) s.ops.push_back(op);
  const int32_t op_index = index_it->second;
  const int32_t first_input = static_cast<int32_t>(s.inputs.size());
  int32_t depth = 0;
  try {
    for (size_t i = 0; i < input_count; ++i) {
      const Handle& h = inputs[i];
      PIPIT_CHECK(h.state_, "batching: input ", i, " of a call to '", op->name,
                  "' is an empty Handle");
      GraphState* owner = h.state_.get();
      int32_t node = h.node_;
      uint32_t generation = h.generation_;
      PIPIT_CHECK(GraphState::resolve(owner, node, generation), "batching: input ", i,
                  " of a call to '", op->name, "' is node ", h.node_,
                  " of a graph that was cleared since");
      PIPIT_CHECK(owner == &s, "batching: input ", i, " of a call to '", op->name, "' is ",
                  owner->describe(node),
                  " of another graph (handles work only in their own graph)");
      const BatchNode& producer = s.nodes[static_cast<size_t>(node)];
      s.inputs.push_back({node, h.output_});
      depth = std::max(depth, producer.depth + 1);
    }
  } catch (...) {
    s.inputs.resize(static_cast<size_t>(first_input));
    throw;
  }
  const int32_t count = static_cast<int32_t>(input_count);
  const NodeRef* refs = &s.inputs[static_cast<size_t>(first_input)];
  int32_t node_id = s.reuse && op->pure ? reuse_call(s, op_index, refs, count) : -1;
  if (node_id >= 0) {
    s.inputs.resize(static_cast<size_t>(first_input));
  } else {
    BatchNode n;
    n.op = op_index;
    n.first_input = first_input;
    n.input_count = count;
    n.depth = depth;
    s.nodes.push_back(n);
    node_id = static_cast<int32_t>(s.nodes.size() - 1);
  }
  for (int32_t o = 0; o < op->outputs; ++o) outputs[o] = Handle(state_, node_id, o, s.generation);
}

void Graph::clear() {
  GraphState& s = *state_;
  ++s.generation;
  s.nodes.clear();
  s.inputs.clear();
  s.batches.clear();
  s.signatures.clear();
  s.signature_begin.clear();
  s.reuse_slots.clear();
  s.reuse_used = 0;
  s.index_batch = -1;
  s.planned_from = 0;
}

void Graph::merge(Graph& other) {
  PIPIT_CHECK(&other != this, "batching: a graph cannot merge into itself");
  GraphState& s = *state_;
  GraphState& o = *other.state_;
  const int32_t node_offset = static_cast<int32_t>(s.nodes.size());
  const int32_t input_offset = static_cast<int32_t>(s.inputs.size());
  const int32_t batch_offset = static_cast<int32_t>(s.batches.size());
  for (NodeRef ref : o.inputs) s.inputs.push_back({ref.node + node_offset, ref.output});
  for (auto& batch : o.batches) s.batches.push_back(std::move(batch));
  const int32_t signature_offset = static_cast<int32_t>(s.signatures.size());
  s.signatures.insert(s.signatures.end(), o.signatures.begin(), o.signatures.end());
  for (int32_t begin : o.signature_begin) s.signature_begin.push_back(begin + signature_offset);
  for (BatchNode n : o.nodes) {
    int32_t op = -1;
    if (n.op >= 0) {
      const auto& shared = o.ops[static_cast<size_t>(n.op)];
      auto [it, added] = s.op_index.try_emplace(shared->id, static_cast<int32_t>(s.ops.size()));
      if (added) s.ops.push_back(shared);
      op = it->second;
    }
    n.op = op;
    n.first_input += input_offset;
    if (n.batch >= 0) n.batch += batch_offset;
    n.key = -1;  // keys are per graph; this one's are found again when its nodes are ready
    s.nodes.push_back(n);
  }
  // other's handles now forward here; other starts afresh.
  o.merged_into = state_;
  o.node_offset = node_offset;
  o.merged_generation = s.generation;
  o.nodes.clear();
  o.inputs.clear();
  o.batches.clear();
  o.signatures.clear();
  o.signature_begin.clear();
  const bool reuse = o.reuse;
  other.state_ = std::make_shared<GraphState>();
  other.state_->reuse = reuse;
}

}  // namespace pipit::batching
