#include "tensor/shape.h"

#include <sstream>

#include "tensor/error.h"

namespace pipit {

namespace {

// The product of the nonzero dims, or -1 when a dim is negative or the product overflows.
int64_t nonzero_product(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) {
    if (s < 0) return -1;
    if (s != 0 && __builtin_mul_overflow(n, s, &n)) return -1;
  }
  return n;
}

[[noreturn]] void fail_shape(const Shape& shape, const char* op) {
  for (int64_t s : shape) {
    PIPIT_CHECK(s >= 0, op, ": shape ", shape_str(shape), " has a negative dimension ", s);
  }
  throw Error(detail::concat(op, ": shape ", shape_str(shape),
                             " is too large: the product of its dimensions overflows int64"));
}

}  // namespace

void check_shape(const Shape& shape, const char* op) {
  if (nonzero_product(shape) < 0) fail_shape(shape, op);
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = nonzero_product(shape);
  if (n < 0) fail_shape(shape, "numel");
  for (int64_t s : shape) {
    if (s == 0) return 0;
  }
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  check_shape(shape, "contiguous_strides");
  // Every suffix product is at most the checked product of the nonzero dims, or 0.
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
