// Fused attention on the CPU. Each (batch, head) runs on one thread, kBlock queries at a
// time: the block's weights ([kBlock, Tk], in cache) are the only weights held, never the
// whole [Tq, Tk]; the products are single-threaded GEMM calls (tensor/cpu/gemm.h) on the
// operands' rows where they lie (a packed projection's heads are not copied), whose sizes
// depend only on the shapes, so the bits do not depend on the thread count. The backward
// rebuilds the weights with the forward's own code rather than from lse. Half inputs are
// computed on in f32: each head's rows are widened (exactly) as the head is taken up, and its
// results rounded once as it is left, so no whole operand is ever copied.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/gemm.h"
#include "tensor/cpu/loop.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/kernel_layout.h"

namespace pipit {
namespace {

using cpu::compute_t;

// One [B, H, T, D] operand as stored: data and strides in elements (unit in D), so the heads of
// a packed projection are read in place.
template <typename S>
struct Heads {
  S* data;
  int64_t batch_stride, head_stride, row_stride;
  // Head h of B * H, counted batch-major.
  S* head(int64_t h, int64_t heads) const {
    return data + h / heads * batch_stride + h % heads * head_stride;
  }
};

template <typename S>
Heads<S> heads_of(const Tensor& t) {
  return {static_cast<S*>(t.raw_data()), t.strides()[0], t.strides()[1], t.strides()[2]};
}

// One head's rows as the kernels compute on them, in T (f32 for half storage, else the stored
// type): the stored rows in place, or a widened copy with row stride D.
template <typename T>
struct HeadRows {
  T* data;
  int64_t ld;
};

// `rows` rows of head h of x, read in place when stored in T, else widened into buffer.
template <typename T, typename S>
HeadRows<const T> read_head(const Heads<const S>& x, int64_t h, int64_t heads, int64_t rows,
                            int64_t D, std::vector<T>& buffer) {
  const S* stored = x.head(h, heads);
  if constexpr (std::is_same_v<T, S>) {
    return {stored, x.row_stride};
  } else {
    for (int64_t r = 0; r < rows; ++r)
      cpu::widen_run(stored + r * x.row_stride, 1, &buffer[r * D], D);
    return {buffer.data(), D};
  }
}

// Where a kernel writes head h of x: in place when stored in T, else buffer, which write_head
// then rounds into x.
template <typename T, typename S>
HeadRows<T> head_target(const Heads<S>& x, int64_t h, int64_t heads, int64_t D,
                        std::vector<T>& buffer) {
  if constexpr (std::is_same_v<T, S>) {
    return {x.head(h, heads), x.row_stride};
  } else {
    return {buffer.data(), D};
  }
}

template <typename T, typename S>
void write_head(const std::vector<T>& buffer, const Heads<S>& x, int64_t h, int64_t heads,
                int64_t rows, int64_t D) {
  if constexpr (!std::is_same_v<T, S>) {
    S* stored = x.head(h, heads);
    for (int64_t r = 0; r < rows; ++r)
      cpu::round_run(&buffer[r * D], stored + r * x.row_stride, 1, D);
  }
}

// Keys query i sees: all Tk, or 0..i + Tk - Tq when causal.
int64_t visible_keys(int64_t i, const AttentionSizes& n, bool causal) {
  return causal ? i + n.keys - n.queries + 1 : n.keys;
}

// Queries are taken kBlock at a time: their scores against the keys the block's last query
// sees are one GEMM, and so are the products with v.
constexpr int64_t kBlock = 64;

// The softmax weights of queries [i0, i0 + m) of one head, p [m, seen] (seen = the last
// query's visible keys), from scores = q_block k^T: scaled, masked to 0 past each query's
// diagonal. lse, when given, gets each row's log-sum-exp. The forward and the backward both
// call this, so the backward's weights are the forward's bits.
template <typename T>
void block_weights(HeadRows<const T> q, HeadRows<const T> k, int64_t i0, int64_t m, int64_t seen,
                   const AttentionSizes& n, T scale, bool causal, T* p, T* lse) {
  cpu::gemm<T>(false, true, m, seen, n.head_dim, q.data + i0 * q.ld, q.ld, k.data, k.ld, T(0), p,
               seen);
  for (int64_t r = 0; r < m; ++r) {
    T* row = p + r * seen;
    const int64_t visible = visible_keys(i0 + r, n, causal);
    for (int64_t j = 0; j < visible; ++j) row[j] *= scale;
    const T mx = cpu::lane_max(row, visible);
    cpu::exp_shifted(row, mx, row, visible);
    const T sum = cpu::lane_sum<T>(visible, [&](int64_t j) { return row[j]; });
    const T inv = T(1) / sum;
    for (int64_t j = 0; j < visible; ++j) row[j] *= inv;
    std::fill(row + visible, row + seen, T(0));
    if (lse) lse[r] = mx + std::log(sum);
  }
}

template <typename S, typename T = compute_t<S>>
void attention_forward(Heads<const S> q, Heads<const S> k, Heads<const S> v, Heads<S> out, T* lse,
                       const AttentionSizes& n, T scale, bool causal) {
  const int64_t heads = n.batch * n.heads, D = n.head_dim, Tq = n.queries, Tk = n.keys;
  const int threads = cpu::threads_for(heads * Tq * Tk * D / 8);
  cpu::parallel_range(heads, threads, [&](int64_t begin, int64_t end) {
    std::vector<T> p(static_cast<size_t>(std::min(kBlock, Tq) * Tk));
    // Heads in T are read in place, half ones through these copies.
    const int64_t copy_width = std::is_same_v<T, S> ? 0 : D, q_rows = copy_width * Tq,
                  k_rows = copy_width * Tk;
    std::vector<T> qb(q_rows), kb(k_rows), vb(k_rows), ob(q_rows);
    for (int64_t h = begin; h < end; ++h) {
      const HeadRows<const T> qh = read_head(q, h, n.heads, Tq, D, qb),
                              kh = read_head(k, h, n.heads, Tk, D, kb),
                              vh = read_head(v, h, n.heads, Tk, D, vb);
      const HeadRows<T> oh = head_target(out, h, n.heads, D, ob);
      for (int64_t i0 = 0; i0 < Tq; i0 += kBlock) {
        const int64_t m = std::min(kBlock, Tq - i0), seen = visible_keys(i0 + m - 1, n, causal);
        block_weights(qh, kh, i0, m, seen, n, scale, causal, p.data(), lse + h * Tq + i0);
        cpu::gemm<T>(false, false, m, D, seen, p.data(), seen, vh.data, vh.ld, T(0),
                     oh.data + i0 * oh.ld, oh.ld);
      }
      write_head(ob, out, h, n.heads, Tq, D);
    }
  });
}

// Block by block of queries, with P the weights rebuilt from q and k and dP = dO v^T:
// dv += P^T dO, dS = scale P * (dP - rowsum(dO * O)), dq = dS k, dk += dS^T q. Blocks run in
// order, so dk and dv add their terms in one order.
template <typename S, typename T = compute_t<S>>
void attention_backward_heads(Heads<const S> go, Heads<const S> q, Heads<const S> k,
                              Heads<const S> v, Heads<const S> out, Heads<S> gq, Heads<S> gk,
                              Heads<S> gv, const AttentionSizes& n, T scale, bool causal) {
  const int64_t heads = n.batch * n.heads, D = n.head_dim, Tq = n.queries, Tk = n.keys;
  const int threads = cpu::threads_for(heads * Tq * Tk * D / 4);
  cpu::parallel_range(heads, threads, [&](int64_t begin, int64_t end) {
    const size_t block = static_cast<size_t>(std::min(kBlock, Tq) * Tk);
    std::vector<T> p(block), ds(block);
    const int64_t copy_width = std::is_same_v<T, S> ? 0 : D, q_rows = copy_width * Tq,
                  k_rows = copy_width * Tk;
    std::vector<T> gob(q_rows), qb(q_rows), kb(k_rows), vb(k_rows), ob(q_rows), gqb(q_rows),
        gkb(k_rows), gvb(k_rows);
    for (int64_t h = begin; h < end; ++h) {
      const HeadRows<const T> qh = read_head(q, h, n.heads, Tq, D, qb),
                              kh = read_head(k, h, n.heads, Tk, D, kb),
                              vh = read_head(v, h, n.heads, Tk, D, vb),
                              goh = read_head(go, h, n.heads, Tq, D, gob),
                              oh = read_head(out, h, n.heads, Tq, D, ob);
      const HeadRows<T> gqh = head_target(gq, h, n.heads, D, gqb),
                        gkh = head_target(gk, h, n.heads, D, gkb),
                        gvh = head_target(gv, h, n.heads, D, gvb);
      for (int64_t j = 0; j < Tk; ++j) {
        std::fill(gkh.data + j * gkh.ld, gkh.data + j * gkh.ld + D, T(0));
        std::fill(gvh.data + j * gvh.ld, gvh.data + j * gvh.ld + D, T(0));
      }
      for (int64_t i0 = 0; i0 < Tq; i0 += kBlock) {
        const int64_t m = std::min(kBlock, Tq - i0), seen = visible_keys(i0 + m - 1, n, causal);
        const T* go_block = goh.data + i0 * goh.ld;
        block_weights(qh, kh, i0, m, seen, n, scale, causal, p.data(), static_cast<T*>(nullptr));
        cpu::gemm<T>(false, true, m, seen, D, go_block, goh.ld, vh.data, vh.ld, T(0), ds.data(),
                     seen);
        for (int64_t r = 0; r < m; ++r) {
          const T* gor = go_block + r * goh.ld;
          const T* orow = oh.data + (i0 + r) * oh.ld;
          const T row_dot = cpu::lane_sum<T>(D, [&](int64_t d) { return gor[d] * orow[d]; });
          const T* pr = p.data() + r * seen;
          T* dsr = ds.data() + r * seen;
          for (int64_t j = 0; j < seen; ++j) dsr[j] = pr[j] * (dsr[j] - row_dot) * scale;
        }
        cpu::gemm<T>(false, false, m, D, seen, ds.data(), seen, kh.data, kh.ld, T(0),
                     gqh.data + i0 * gqh.ld, gqh.ld);
        cpu::gemm<T>(true, false, seen, D, m, ds.data(), seen, qh.data + i0 * qh.ld, qh.ld, T(1),
                     gkh.data, gkh.ld);
        cpu::gemm<T>(true, false, seen, D, m, p.data(), seen, go_block, goh.ld, T(1), gvh.data,
                     gvh.ld);
      }
      write_head(gqb, gq, h, n.heads, Tq, D);
      write_head(gkb, gk, h, n.heads, Tk, D);
      write_head(gvb, gv, h, n.heads, Tk, D);
    }
  });
}

}  // namespace

void CpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                           bool causal, const Tensor& out, const Tensor& lse) {
  const AttentionSizes n = check_attention("attention", q, k, v, lse, causal, {&out});
  if (n.batch * n.heads * n.queries == 0) return;
  PIPIT_DISPATCH_FLOAT_AND_HALF(q.dtype(), "attention", {
    using S = scalar_t;
    using T = compute_t<S>;
    attention_forward<S>(heads_of<const S>(q), heads_of<const S>(k), heads_of<const S>(v),
                         heads_of<S>(out), lse.data<T>(), n, static_cast<T>(scale), causal);
  });
}

void CpuBackend::attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor& out, const Tensor& lse,
                                    double scale, bool causal, const Tensor& grad_q,
                                    const Tensor& grad_k, const Tensor& grad_v) {
  const char* op = "attention_backward";
  const AttentionSizes n = check_attention(op, q, k, v, lse, causal, {&grad_q, &grad_k, &grad_v});
  check_attention(op, q, k, v, lse, causal, {&out});
  check_attention(op, q, k, v, lse, causal, {&grad_out});
  if (n.batch * n.heads == 0) return;
  PIPIT_DISPATCH_FLOAT_AND_HALF(q.dtype(), op, {
    using S = scalar_t;
    using T = compute_t<S>;
    attention_backward_heads<S>(heads_of<const S>(grad_out), heads_of<const S>(q),
                                heads_of<const S>(k), heads_of<const S>(v), heads_of<const S>(out),
                                heads_of<S>(grad_q), heads_of<S>(grad_k), heads_of<S>(grad_v), n,
                                static_cast<T>(scale), causal);
  });
}

}  // namespace pipit
