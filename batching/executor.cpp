#include <unordered_map>

#include "autograd/ops.h"
#include "batching/batch_output.h"
#include "batching/gather_rows.h"
#include "batching/planner.h"

namespace pipit::batching {

namespace {

const NodeRef& input_of(const GraphState& s, int32_t node, int32_t position) {
  return s.inputs[static_cast<size_t>(s.nodes[static_cast<size_t>(node)].first_input + position)];
}

// Input `position` of every call in `batch`, as one tensor: a view of one producer's output
// when the rows come in this batch's order, else gathered row by row.
Tensor batch_input(const GraphState& s, const std::vector<int32_t>& batch, int32_t position,
                   GraphStats& stats) {
  const int64_t k = static_cast<int64_t>(batch.size());
  const NodeRef& head = input_of(s, batch.front(), position);
  const BatchNode& head_producer = s.nodes[static_cast<size_t>(head.node)];
  bool in_order = true;
  for (int64_t i = 0; i < k && in_order; ++i) {
    const NodeRef& ref = input_of(s, batch[static_cast<size_t>(i)], position);
    const BatchNode& p = s.nodes[static_cast<size_t>(ref.node)];
    in_order = p.batch == head_producer.batch && ref.output == head.output &&
               p.row == head_producer.row + i;
  }
  if (in_order) {  // one producer batch, in this batch's order: no copy at all
    const Tensor& whole =
        s.batches[static_cast<size_t>(head_producer.batch)][static_cast<size_t>(head.output)];
    ++stats.views;
    return head_producer.row == 0 && whole.size(0) == k ? whole
                                                        : narrow(whole, 0, head_producer.row, k);
  }
  std::vector<Tensor> sources;
  std::unordered_map<int64_t, int32_t> source_of;  // (batch, output) -> index in sources
  std::vector<RowRef> rows;
  for (int64_t i = 0; i < k; ++i) {
    const NodeRef& ref = input_of(s, batch[static_cast<size_t>(i)], position);
    const BatchNode& p = s.nodes[static_cast<size_t>(ref.node)];
    const int64_t id = int64_t{p.batch} << 16 | ref.output;
    auto [it, added] = source_of.try_emplace(id, static_cast<int32_t>(sources.size()));
    if (added) {
      sources.push_back(s.batches[static_cast<size_t>(p.batch)][static_cast<size_t>(ref.output)]);
    }
    rows.push_back({it->second, p.row});
  }
  Tensor gathered = gather_rows(sources, rows);
  ++stats.gathers;
  return gathered;
}

}  // namespace

void execute_batch(GraphState& s, const std::vector<int32_t>& batch, GraphStats& stats) {
  const BatchNode& first = s.nodes[static_cast<size_t>(batch.front())];
  const Op& op = *s.ops[static_cast<size_t>(first.op)];
  const int64_t k = static_cast<int64_t>(batch.size());
  std::vector<Tensor> inputs(static_cast<size_t>(first.input_count));
  try {
    for (int32_t position = 0; position < first.input_count; ++position) {
      inputs[static_cast<size_t>(position)] = batch_input(s, batch, position, stats);
    }
  } catch (const std::exception& e) {
    throw Error(detail::concat("batching: gathering the inputs of ", k, " calls of key ",
                               s.key_name(first.key), " (first ", s.describe(batch.front()),
                               "): ", e.what()));
  }
  std::vector<Tensor> outputs;
  try {
    outputs = op.run(inputs);
  } catch (const std::exception& e) {
    throw Error(detail::concat("batching: key ", s.key_name(first.key), " failed on a batch of ", k,
                               " (first ", s.describe(batch.front()), "): ", e.what()));
  }
  PIPIT_CHECK(static_cast<int>(outputs.size()) == op.outputs, "batching: key ",
              s.key_name(first.key), " returned ", outputs.size(), " outputs, its op declares ",
              op.outputs);
  for (size_t o = 0; o < outputs.size(); ++o) {
    PIPIT_CHECK(outputs[o].defined() && outputs[o].dim() >= 1 && outputs[o].size(0) == k,
                "batching: output ", o, " of key ", s.key_name(first.key), " on a batch of ", k,
                " has shape ", outputs[o].defined() ? shape_str(outputs[o].shape()) : "undefined",
                "; it must have the batch (", k, ") as dim 0");
  }
  for (Tensor& output : outputs) output = expose_batch_output(output);
  const int32_t index = s.add_batch(std::move(outputs));
  for (int64_t i = 0; i < k; ++i) {
    BatchNode& n = s.nodes[static_cast<size_t>(batch[static_cast<size_t>(i)])];
    n.batch = index;
    n.row = static_cast<int32_t>(i);
  }
  stats.nodes_run += k;
  ++stats.batches_run;
}

void Graph::run(Strategy strategy) {
  last_batches_.clear();
  run_batches(*state_, strategy, stats_, last_batches_);
  state_->planned_from = static_cast<int32_t>(state_->nodes.size());
}

}  // namespace pipit::batching
