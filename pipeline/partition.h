#pragma once
// Partitioning: which layers of a Sequential each model chunk holds. Both functions return
// one range per chunk, p * v ranges in model order, contiguous and covering every layer;
// chunk c lives on stage c % p.
#include <cstddef>
#include <cstdint>
#include <string>
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

// Chunks of counts[c] layers each, in model order. Throws naming the first entry that is
// not >= 1, or the sum when it is not total_layers, or the count when it is not `chunks`.
std::vector<LayerRange> ranges_from_counts(const std::vector<int64_t>& counts, size_t total_layers,
                                           size_t chunks);
std::vector<int64_t> layer_counts(const std::vector<LayerRange>& ranges);
// `ranges` after moving `count` layers from chunk `from` to its neighbour `to` across their
// common boundary (the first layers of `from` when to = from - 1, its last ones when
// to = from + 1). Throws naming what is wrong: chunks out of range or not neighbours, a
// count < 1, or one that would leave `from` empty.
std::vector<LayerRange> move_layers(std::vector<LayerRange> ranges, int from, int to,
                                    int64_t count);
// "[0, 12) [12, 24)": for messages.
std::string ranges_str(const std::vector<LayerRange>& ranges);

}  // namespace pipit
