#pragma once
// Which nodes run together, and in what order (internal: Graph::run uses it).
#include <cstdint>
#include <vector>

#include "batching/graph.h"
#include "batching/graph_state.h"

namespace pipit::batching {

// Runs every not-yet-run node a live handle needs (directly or through the nodes that consume
// it), batch by batch: each batch is ready nodes of one key (known once a node's inputs have
// run), chosen by `strategy`. Appends each batch's node ids to `batches`.
void run_batches(GraphState& state, Strategy strategy, GraphStats& stats,
                 std::vector<std::vector<int32_t>>& batches);

// Runs one batch: gathers each input position's rows (the producer's batch itself when the
// rows are in order), calls the op once, records where each node's outputs are.
void execute_batch(GraphState& state, const std::vector<int32_t>& batch, GraphStats& stats);

}  // namespace pipit::batching
