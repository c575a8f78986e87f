#pragma once
// Bucketing examples by size for a data loader: examples of similar size batch better (their
// graphs have more nodes of the same depth and shape at the same time).
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

namespace pipit::batching {

// The example indices sorted by size (ties in index order), cut into batches of
// `batch_size` (the last may be smaller).
inline std::vector<std::vector<int64_t>> bucket_by_size(const std::vector<int64_t>& sizes,
                                                        int64_t batch_size) {
  std::vector<int64_t> order(sizes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&sizes](int64_t a, int64_t b) {
    return sizes[static_cast<size_t>(a)] < sizes[static_cast<size_t>(b)];
  });
  std::vector<std::vector<int64_t>> batches;
  for (size_t i = 0; i < order.size(); i += static_cast<size_t>(std::max<int64_t>(1, batch_size))) {
    const size_t end =
        std::min(order.size(), i + static_cast<size_t>(std::max<int64_t>(1, batch_size)));
    batches.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(i),
                         order.begin() + static_cast<std::ptrdiff_t>(end));
  }
  return batches;
}

}  // namespace pipit::batching
