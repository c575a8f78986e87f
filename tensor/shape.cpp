#include "tensor/shape.h"

#include <sstream>

#include "tensor/error.h"

namespace pipit {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return strides;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    PIPIT_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ",
                shape_str(b), " cannot be broadcast together");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int64_t normalize_dim(int64_t dim, int64_t rank, const char* op) {
  int64_t d = dim < 0 ? dim + rank : dim;
  PIPIT_CHECK(d >= 0 && d < rank, op, ": dim ", dim, " out of range for a tensor of rank ", rank);
  return d;
}

}  // namespace pipit
