// Reductions over any set of dims, and argmax. Results never depend on the thread count:
// work is split over output elements or over fixed-size blocks combined in order.
#include <limits>
#include <vector>

#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/loop.h"
#include "tensor/kernel_layout.h"

namespace pipit {
namespace {

constexpr int64_t kSumBlock = 16384;

template <typename T>
using acc_t = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;

template <typename T>
acc_t<T> identity(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return 0;
    case ReduceOp::max:
      return std::numeric_limits<T>::lowest();
    case ReduceOp::min:
      return std::numeric_limits<T>::max();
  }
  return 0;
}

template <typename T>
acc_t<T> combine(ReduceOp op, acc_t<T> a, acc_t<T> b) {
  switch (op) {
    case ReduceOp::sum:
      return a + b;
    case ReduceOp::max:
      return (a > b || a != a) ? a : b;
    case ReduceOp::min:
      return (a < b || a != a) ? a : b;
  }
  return a;
}

// Eight running results, element i going to lane i mod 8, then the lanes combined in order: a
// single chain would wait on each add's latency (a sum of 1M floats took 1.9 ms, 8x torch's).
// The order depends only on n.
template <typename T, ReduceOp Op>
acc_t<T> reduce_lanes(const T* x, int64_t n) {
  constexpr int kLanes = 8;
  acc_t<T> lanes[kLanes];
  for (auto& lane : lanes) lane = identity<T>(Op);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      lanes[j] = combine<T>(Op, lanes[j], static_cast<acc_t<T>>(x[i + j]));
    }
  }
  acc_t<T> acc = identity<T>(Op);
  for (const auto lane : lanes) acc = combine<T>(Op, acc, lane);
  for (; i < n; ++i) acc = combine<T>(Op, acc, static_cast<acc_t<T>>(x[i]));
  return acc;
}

template <typename T>
acc_t<T> reduce_run(ReduceOp op, const T* x, int64_t n) {
  switch (op) {
    case ReduceOp::sum:
      return reduce_lanes<T, ReduceOp::sum>(x, n);
    case ReduceOp::max:
      return reduce_lanes<T, ReduceOp::max>(x, n);
    case ReduceOp::min:
      return reduce_lanes<T, ReduceOp::min>(x, n);
  }
  return identity<T>(op);
}

// out[k] = reduce(x[k * R .. (k + 1) * R)).
template <typename T>
void reduce_rows(ReduceOp op, const T* x, int64_t rows, int64_t R, T* out) {
  // The summation order depends only on R, never on the thread count.
  if (R <= kSumBlock) {
    cpu::parallel_range(rows, cpu::threads_for(rows * R), [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) out[k] = static_cast<T>(reduce_run(op, x + k * R, R));
    });
    return;
  }
  int64_t blocks = (R + kSumBlock - 1) / kSumBlock;
  std::vector<acc_t<T>> partial(static_cast<size_t>(blocks));
  for (int64_t k = 0; k < rows; ++k) {
    const T* row = x + k * R;
    cpu::parallel_range(blocks, get_num_threads(), [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        partial[b] = reduce_run(op, row + b * kSumBlock, std::min(kSumBlock, R - b * kSumBlock));
      }
    });
    acc_t<T> acc = identity<T>(op);
    for (auto p : partial) acc = combine<T>(op, acc, p);
    out[k] = static_cast<T>(acc);
  }
}

// acc[k] = combine(acc[k], row[k]), with the op fixed at compile time so the loop vectorizes;
// a row of half elements S is widened as it is read.
template <typename T, ReduceOp Op, typename S = T>
void combine_row(acc_t<T>* acc, const S* row, int64_t n) {
  for (int64_t k = 0; k < n; ++k) acc[k] = combine<T>(Op, acc[k], static_cast<acc_t<T>>(row[k]));
}

// out[k] = reduce over r of x[r * K + k].
template <typename T>
void reduce_columns(ReduceOp op, const T* x, int64_t R, int64_t K, T* out) {
  auto row_op = op == ReduceOp::sum   ? combine_row<T, ReduceOp::sum>
                : op == ReduceOp::max ? combine_row<T, ReduceOp::max>
                                      : combine_row<T, ReduceOp::min>;
  cpu::parallel_range(K, cpu::threads_for(R * K), [&](int64_t begin, int64_t end) {
    std::vector<acc_t<T>> acc(static_cast<size_t>(end - begin), identity<T>(op));
    for (int64_t r = 0; r < R; ++r) row_op(acc.data(), x + r * K + begin, end - begin);
    for (int64_t k = begin; k < end; ++k) out[k] = static_cast<T>(acc[k - begin]);
  });
}

// out[k] = reduce over r of x[r * ld + k], in reduce_lanes's order (element r to lane r mod 8,
// the lanes combined in order, then the rest), so the bits are reduce_rows's on the transposed
// copy: the reduced dim of a transposed view (a bias gradient's sum over a transposed
// gradient) summed where it lies, eight rows of partial results at a time.
template <typename T, ReduceOp Op, typename S>
void reduce_lanes_down(const S* x, int64_t R, int64_t K, int64_t ld, T* out) {
  constexpr int kLanes = 8;
  cpu::parallel_range(K, cpu::threads_for(R * K), [&](int64_t begin, int64_t end) {
    const int64_t n = end - begin;
    std::vector<acc_t<T>> lanes(static_cast<size_t>(kLanes * n), identity<T>(Op));
    int64_t r = 0;
    for (; r + kLanes <= R; r += kLanes) {
      for (int j = 0; j < kLanes; ++j) {
        combine_row<T, Op, S>(&lanes[j * n], x + (r + j) * ld + begin, n);
      }
    }
    std::vector<acc_t<T>> acc(static_cast<size_t>(n), identity<T>(Op));
    for (int j = 0; j < kLanes; ++j) {
      for (int64_t k = 0; k < n; ++k) acc[k] = combine<T>(Op, acc[k], lanes[j * n + k]);
    }
    for (; r < R; ++r) combine_row<T, Op, S>(acc.data(), x + r * ld + begin, n);
    for (int64_t k = 0; k < n; ++k) out[begin + k] = static_cast<T>(acc[k]);
  });
}

// Whether `in` is a transposed 2-D view reduced over its dim 1, which reduce_lanes_down sums
// where it lies.
bool reduces_lanes_down(const Tensor& in, const std::vector<bool>& reduced) {
  return in.dim() == 2 && reduced[1] && !reduced[0] && in.strides()[0] == 1 &&
         in.strides()[1] >= in.shape()[0] && in.shape()[1] <= kSumBlock;
}

template <typename T, typename S>
void lanes_down(ReduceOp op, const Tensor& in, T* out) {
  const S* x = static_cast<const S*>(in.raw_data());
  const int64_t K = in.shape()[0], R = in.shape()[1], ld = in.strides()[1];
  switch (op) {
    case ReduceOp::sum:
      return reduce_lanes_down<T, ReduceOp::sum>(x, R, K, ld, out);
    case ReduceOp::max:
      return reduce_lanes_down<T, ReduceOp::max>(x, R, K, ld, out);
    case ReduceOp::min:
      return reduce_lanes_down<T, ReduceOp::min>(x, R, K, ld, out);
  }
}

// A view of t with dims reordered (no copy).
Tensor permuted(const Tensor& t, const std::vector<int64_t>& order) {
  Shape shape, strides;
  for (int64_t d : order) {
    shape.push_back(t.shape()[d]);
    strides.push_back(t.strides()[d]);
  }
  return Tensor::from_storage(t.storage(), shape, strides, t.offset(), t.dtype());
}

template <typename T>
void reduce_typed(ReduceOp op, const Tensor& in, const std::vector<bool>& reduced,
                  const Tensor& out) {
  std::vector<int64_t> order;
  int64_t R = 1;
  bool leading = true, seen_kept = false;
  for (int64_t d = 0; d < in.dim(); ++d) {
    if (!reduced[d]) {
      order.push_back(d);
      if (in.shape()[d] != 1) seen_kept = true;
    } else if (seen_kept && in.shape()[d] != 1) {
      leading = false;
    }
  }
  for (int64_t d = 0; d < in.dim(); ++d) {
    if (reduced[d]) {
      order.push_back(d);
      R *= in.shape()[d];
    }
  }
  const int64_t K = out.numel();
  T* o = out.data<T>();
  if (in.is_contiguous() && leading && K > 1) {
    return reduce_columns<T>(op, in.data<T>(), R, K, o);
  }
  if (reduces_lanes_down(in, reduced)) return lanes_down<T, T>(op, in, o);
  Tensor view = permuted(in, order);
  Tensor rows = dense(view);
  reduce_rows<T>(op, rows.data<T>(), K, R, o);
}

}  // namespace

void CpuBackend::reduce(ReduceOp op, const Tensor& in, std::span<const int64_t> dims,
                        const Tensor& out) {
  PIPIT_CHECK(out.is_contiguous(), "reduce: output must be contiguous");
  std::vector<bool> reduced(static_cast<size_t>(in.dim()), false);
  for (int64_t d : dims) reduced[static_cast<size_t>(d)] = true;
  if (is_half(in.dtype())) {
    // A transposed half gradient (a bias gradient's, under autocast) is summed where it lies,
    // each element widened as it is read; other half inputs through a widened copy.
    return cpu::into_f32(out, [&](const Tensor& target) {
      if (!reduces_lanes_down(in, reduced)) return reduce(op, cpu::widened(in), dims, target);
      if (in.dtype() == DType::bf16)
        return lanes_down<float, cpu::BFloat16>(op, in, target.data<float>());
      lanes_down<float, cpu::Half>(op, in, target.data<float>());
    });
  }
  PIPIT_DISPATCH_NUMERIC(in.dtype(), "reduce", reduce_typed<scalar_t>(op, in, reduced, out));
}

void CpuBackend::argmax(const Tensor& in, int64_t dim, const Tensor& out) {
  if (is_half(in.dtype())) return argmax(cpu::widened(in), dim, out);
  std::vector<int64_t> order;
  for (int64_t d = 0; d < in.dim(); ++d) {
    if (d != dim) order.push_back(d);
  }
  order.push_back(dim);
  Tensor view = permuted(in, order);
  Tensor rows = dense(view);
  const int64_t R = in.shape()[dim];
  const int64_t K = out.numel();
  int64_t* o = out.data<int64_t>();
  PIPIT_DISPATCH_NUMERIC(in.dtype(), "argmax", {
    const scalar_t* x = rows.data<scalar_t>();
    cpu::parallel_range(K, cpu::threads_for(K * R), [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        const scalar_t* row = x + k * R;
        int64_t best = 0;
        for (int64_t r = 1; r < R; ++r) {
          if (row[r] > row[best]) best = r;
        }
        o[k] = best;
      }
    });
  });
}

}  // namespace pipit
