#include "batching/handle.h"

#include <algorithm>

#include "autograd/ops.h"
#include "batching/gather_rows.h"
#include "batching/graph_state.h"

namespace pipit::batching {

bool GraphState::resolve(GraphState*& state, int32_t& node, uint32_t& generation) {
  while (true) {
    if (generation != state->generation) return false;
    if (!state->merged_into) return true;
    node += state->node_offset;
    generation = state->merged_generation;
    state = state->merged_into.get();
  }
}

std::string GraphState::key_name(int32_t key) const {
  if (key < 0) return "(none yet: its inputs have not run)";
  return ops[static_cast<size_t>(key_ops[static_cast<size_t>(key)])]->name + " #" +
         std::to_string(key);
}

std::string GraphState::describe(int32_t node) const {
  const int32_t op = nodes[static_cast<size_t>(node)].op;
  return "node " + std::to_string(node) + " (" +
         (op >= 0 ? ops[static_cast<size_t>(op)]->name : std::string("value")) + ")";
}

namespace {

// Where a handle's node lives now (after merges); state null when the graph was cleared.
struct Resolved {
  GraphState* state = nullptr;
  int32_t node = -1;
};

Resolved resolve(const std::shared_ptr<GraphState>& owner, int32_t node, uint32_t generation) {
  GraphState* state = owner.get();
  if (!state || !GraphState::resolve(state, node, generation)) return {};
  return {state, node};
}

}  // namespace

Handle::Handle(std::shared_ptr<GraphState> state, int32_t node, int32_t output, uint32_t generation)
    : state_(std::move(state)), node_(node), output_(output), generation_(generation) {
  acquire();
}

Handle::Handle(const Handle& other)
    : state_(other.state_),
      node_(other.node_),
      output_(other.output_),
      generation_(other.generation_) {
  acquire();
}

Handle::Handle(Handle&& other) noexcept
    : state_(std::move(other.state_)),
      node_(other.node_),
      output_(other.output_),
      generation_(other.generation_) {
  other.state_ = nullptr;
}

Handle& Handle::operator=(Handle other) noexcept {
  release();
  state_ = std::move(other.state_);
  node_ = other.node_;
  output_ = other.output_;
  generation_ = other.generation_;
  other.state_ = nullptr;
  return *this;
}

Handle::~Handle() {
  release();
}

void Handle::acquire() const {
  if (const Resolved r = resolve(state_, node_, generation_); r.state) {
    ++r.state->nodes[static_cast<size_t>(r.node)].handles;
  }
}

void Handle::release() const {
  if (const Resolved r = resolve(state_, node_, generation_); r.state) {
    --r.state->nodes[static_cast<size_t>(r.node)].handles;
  }
}

int32_t Handle::node() const {
  PIPIT_CHECK(state_, "batching: an empty Handle has no node");
  const Resolved r = resolve(state_, node_, generation_);
  PIPIT_CHECK(r.state, "batching: the handle of node ", node_, " is stale: its graph was cleared");
  return r.node;
}

std::string Handle::describe() const {
  if (!state_) return "an empty handle";
  const Resolved r = resolve(state_, node_, generation_);
  if (!r.state) return "node " + std::to_string(node_) + " of a cleared graph";
  return r.state->describe(r.node);
}

bool Handle::ready() const {
  const Resolved r = resolve(state_, node_, generation_);
  return r.state && r.state->nodes[static_cast<size_t>(r.node)].batch >= 0;
}

Tensor Handle::value() const {
  PIPIT_CHECK(state_, "batching: value() of an empty Handle");
  const auto [state, node] = resolve(state_, node_, generation_);
  PIPIT_CHECK(state, "batching: node ", node_,
              " belongs to a graph that was cleared since; its value is gone");
  const BatchNode& n = state->nodes[static_cast<size_t>(node)];
  PIPIT_CHECK(n.batch >= 0, "batching: ", state->describe(node), ", key ", state->key_name(n.key),
              ", has not run: call run() on its graph first");
  const Tensor& batch = state->batches[static_cast<size_t>(n.batch)][static_cast<size_t>(output_)];
  if (batch.size(0) == 1) return squeeze(batch, 0);
  return squeeze(narrow(batch, 0, n.row, 1), 0);
}

Tensor stack_values(const std::vector<Handle>& handles) {
  PIPIT_CHECK(!handles.empty(), "batching: stack_values of no handles");
  std::vector<Tensor> sources;
  std::vector<const Tensor*> seen;
  std::vector<RowRef> rows;
  rows.reserve(handles.size());
  for (const Handle& h : handles) {
    PIPIT_CHECK(h.state_, "batching: stack_values of an empty Handle");
    const auto [state, node] = resolve(h.state_, h.node_, h.generation_);
    PIPIT_CHECK(state, "batching: node ", h.node_,
                " belongs to a graph that was cleared since; its value is gone");
    const BatchNode& n = state->nodes[static_cast<size_t>(node)];
    PIPIT_CHECK(n.batch >= 0, "batching: ", state->describe(node), " has not run");
    const Tensor* batch =
        &state->batches[static_cast<size_t>(n.batch)][static_cast<size_t>(h.output_)];
    const size_t source =
        static_cast<size_t>(std::find(seen.begin(), seen.end(), batch) - seen.begin());
    if (source == seen.size()) {
      seen.push_back(batch);
      sources.push_back(*batch);
    }
    rows.push_back({static_cast<int32_t>(source), n.row});
  }
  return gather_rows(sources, rows);
}

}  // namespace pipit::batching
