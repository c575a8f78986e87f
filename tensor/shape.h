#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace pipit {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[2, 3]"
// NumPy broadcasting of two shapes; throws naming `op` and both shapes when incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Maps a possibly negative dim into [0, rank); throws naming `op` when out of range.
int64_t normalize_dim(int64_t dim, int64_t rank, const char* op);

}  // namespace pipit
