#pragma once
// Partitioning: which layers of a Sequential each model chunk holds. Both functions return
// one range per chunk, p * v ranges in model order, contiguous and covering every layer;
// chunk c lives on stage c % p.
#include <cstddef>
#include <vector>

#include "nn/sequential.h"

namespace pipit {

struct LayerRange {
  size_t begin = 0;
  size_t end = 0;  // exclusive
  bool operator==(const LayerRange&) const = default;
};

// Equal layer counts; the remainder goes one layer each to the first chunks.
// Throws when p * v > total_layers or p, v < 1.
std::vector<LayerRange> stage_layer_ranges(size_t total_layers, int stages, int chunks_per_stage);

// Contiguous ranges that minimise the largest chunk's parameter count (layers without
// parameters count as one, so they still spread). Among equally good splits, each cut is
// placed as early as possible, so the result is deterministic; with equal weights this can
// differ from stage_layer_ranges, which gives the remainder to the first chunks.
std::vector<LayerRange> partition_by_parameters(const Sequential& model, int stages,
                                                int chunks_per_stage);

}  // namespace pipit
