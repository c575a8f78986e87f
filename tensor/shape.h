#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace pipit {

using Shape = std::vector<int64_t>;

// Throws unless every dim is >= 0 and the product of the nonzero dims fits in int64. That
// bounds every partial product (each contiguous stride, numel) whatever the order of the dims
// and wherever a zero lies: strides are computed from the other dims of an empty tensor too,
// so [0, 2^62, 2^62] overflows as surely as [2^62, 2^62]. The error begins with `op`.
void check_shape(const Shape& shape, const char* op);
// Both check the shape as check_shape does (shapes arrive from files, frames and configs).
int64_t shape_numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[2, 3]"
// NumPy broadcasting of two shapes; throws naming `op` and both shapes when incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Maps a possibly negative dim into [0, rank); throws naming `op` when out of range.
int64_t normalize_dim(int64_t dim, int64_t rank, const char* op);

}  // namespace pipit
