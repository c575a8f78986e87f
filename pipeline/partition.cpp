#include "pipeline/partition.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "tensor/error.h"

namespace pipit {

namespace {

size_t chunk_count(const char* function, size_t total_layers, int stages, int chunks_per_stage) {
  PIPIT_CHECK(stages >= 1 && chunks_per_stage >= 1, function,
              ": stages and chunks per stage must be >= 1, got p = ", stages,
              ", v = ", chunks_per_stage);
  const size_t chunks = static_cast<size_t>(stages) * static_cast<size_t>(chunks_per_stage);
  PIPIT_CHECK(chunks <= total_layers, function, ": ", stages, " stages x ", chunks_per_stage,
              " chunks per stage = ", chunks, " chunks, but the model has only ", total_layers,
              " layers");
  return chunks;
}

}  // namespace

std::vector<LayerRange> stage_layer_ranges(size_t total_layers, int stages, int chunks_per_stage) {
  const size_t chunks = chunk_count("stage_layer_ranges", total_layers, stages, chunks_per_stage);
  const size_t base = total_layers / chunks, extra = total_layers % chunks;
  std::vector<LayerRange> ranges;
  size_t begin = 0;
  for (size_t c = 0; c < chunks; ++c) {
    const size_t end = begin + base + (c < extra ? 1 : 0);
    ranges.push_back({begin, end});
    begin = end;
  }
  return ranges;
}

std::vector<LayerRange> partition_by_parameters(const Sequential& model, int stages,
                                                int chunks_per_stage) {
  const size_t n = model.size();
  const size_t chunks = chunk_count("partition_by_parameters", n, stages, chunks_per_stage);
  std::vector<int64_t> prefix(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    prefix[i + 1] = prefix[i] + std::max<int64_t>(1, model[i]->parameter_count());
  }
  auto weight = [&](size_t begin, size_t end) { return prefix[end] - prefix[begin]; };

  // best[r * (n + 1) + i]: the smallest possible maximum when layers [i, n) form r non-empty
  // chunks. Computed over suffixes so the cuts can then be chosen front to back.
  constexpr int64_t kInfeasible = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> best((chunks + 1) * (n + 1), kInfeasible);
  auto at = [&](size_t r, size_t i) -> int64_t& { return best[r * (n + 1) + i]; };
  for (size_t i = 0; i < n; ++i) at(1, i) = weight(i, n);
  for (size_t r = 2; r <= chunks; ++r) {
    for (size_t i = 0; i + r <= n; ++i) {
      for (size_t end = i + 1; end + r - 1 <= n; ++end) {
        at(r, i) = std::min(at(r, i), std::max(weight(i, end), at(r - 1, end)));
      }
    }
  }
  const int64_t limit = at(chunks, 0);

  // Among the optimal partitions, take each cut as early as possible (the lexicographically
  // smallest cut list), so the result is unique.
  std::vector<LayerRange> ranges;
  size_t begin = 0;
  for (size_t c = 0; c + 1 < chunks; ++c) {
    const size_t rest = chunks - c - 1;
    size_t end = begin + 1;
    while (weight(begin, end) > limit || at(rest, end) > limit) ++end;
    ranges.push_back({begin, end});
    begin = end;
  }
  ranges.push_back({begin, n});
  return ranges;
}

std::vector<LayerRange> ranges_from_counts(const std::vector<int64_t>& counts, size_t total_layers,
                                           size_t chunks) {
  PIPIT_CHECK(counts.size() == chunks, "partition: ", counts.size(), " layer counts given for ",
              chunks, " chunks (stages x chunks per stage)");
  std::vector<LayerRange> ranges;
  size_t begin = 0;
  for (size_t c = 0; c < counts.size(); ++c) {
    PIPIT_CHECK(counts[c] >= 1, "partition: chunk ", c, " is given ", counts[c],
                " layers; every chunk needs at least 1");
    PIPIT_CHECK(static_cast<uint64_t>(counts[c]) <= total_layers - begin, "partition: chunk ", c,
                " is given ", counts[c], " layers, but only ", total_layers - begin,
                " of the model's ", total_layers, " are left after the chunks before it");
    ranges.push_back({begin, begin + static_cast<size_t>(counts[c])});
    begin = ranges.back().end;
  }
  PIPIT_CHECK(begin == total_layers, "partition: the layer counts add up to ", begin,
              ", but the model has ", total_layers, " layers");
  return ranges;
}

std::vector<int64_t> layer_counts(const std::vector<LayerRange>& ranges) {
  std::vector<int64_t> counts;
  for (const LayerRange& r : ranges) counts.push_back(static_cast<int64_t>(r.end - r.begin));
  return counts;
}

std::vector<LayerRange> move_layers(std::vector<LayerRange> ranges, int from, int to,
                                    int64_t count) {
  const auto chunks = static_cast<int>(ranges.size());
  PIPIT_CHECK(from >= 0 && from < chunks && to >= 0 && to < chunks, "move_layers: chunks ", from,
              " and ", to, " are not both in [0, ", chunks, ")");
  PIPIT_CHECK(to == from - 1 || to == from + 1, "move_layers: chunk ", from,
              " can give layers only to a neighbouring chunk (", from - 1, " or ", from + 1,
              "), not to ", to, "; remap() reaches any partition");
  LayerRange& giver = ranges[static_cast<size_t>(from)];
  const auto held = static_cast<int64_t>(giver.end - giver.begin);
  PIPIT_CHECK(count >= 1 && count < held, "move_layers: chunk ", from, " holds ", held,
              " layers, so it can give 1 to ", held - 1, ", not ", count);
  const auto n = static_cast<size_t>(count);
  if (to == from - 1) {
    giver.begin += n;
    ranges[static_cast<size_t>(to)].end += n;
  } else {
    giver.end -= n;
    ranges[static_cast<size_t>(to)].begin -= n;
  }
  return ranges;
}

std::string ranges_str(const std::vector<LayerRange>& ranges) {
  std::string text;
  for (const LayerRange& r : ranges) {
    text +=
        (text.empty() ? "[" : " [") + std::to_string(r.begin) + ", " + std::to_string(r.end) + ")";
  }
  return text;
}

}  // namespace pipit
