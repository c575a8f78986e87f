// Fused attention on the CPU. Each (batch, head) runs on one thread, kBlock queries at a
// time: the block's weights ([kBlock, Tk], in cache) are the only weights held, never the
// whole [Tq, Tk]; the products are single-threaded GEMM calls (tensor/cpu/gemm.h) on the
// operands' rows where they lie (a packed projection's heads are not copied), whose sizes
// depend only on the shapes, so the bits do not depend on the thread count. The backward
// rebuilds the weights with the forward's own code rather than from lse. Half inputs widen
// to f32 (exactly), as the CPU's half GEMM does.
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

// One [B, H, T, D] operand as the kernels read it: data and strides in elements (unit in D),
// so the heads of a packed projection are read in place.
template <typename T>
struct Heads {
  T* data;
  int64_t batch_stride, head_stride, row_stride;
  // Head h of B * H, counted batch-major.
  T* head(int64_t h, int64_t heads) const {
    return data + h / heads * batch_stride + h % heads * head_stride;
  }
};

template <typename T>
Heads<T> heads_of(const Tensor& t) {
  return {t.data<std::remove_const_t<T>>(), t.strides()[0], t.strides()[1], t.strides()[2]};
}

// t in `dtype`: t itself (strides kept) when it has it, else a contiguous converted copy.
Tensor in_dtype(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = Tensor::empty(t.shape(), dtype);
  backend(t).copy(t, out);
  return out;
}

// Where a kernel writes `out`: out itself when it has `dtype`, else a buffer that write_back
// copies (and rounds) into out.
Tensor target(const Tensor& out, DType dtype) {
  return out.dtype() == dtype ? out : Tensor::empty(out.shape(), dtype);
}
void write_back(const Tensor& buffer, const Tensor& out) {
  if (!buffer.same_storage(out)) backend(out).copy(buffer, out);
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
void block_weights(const T* q, int64_t ldq, const T* k, int64_t ldk, int64_t i0, int64_t m,
                   int64_t seen, const AttentionSizes& n, T scale, bool causal, T* p, T* lse) {
  cpu::gemm<T>(false, true, m, seen, n.head_dim, q + i0 * ldq, ldq, k, ldk, T(0), p, seen);
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

template <typename T>
void attention_forward(Heads<const T> q, Heads<const T> k, Heads<const T> v, Heads<T> out, T* lse,
                       const AttentionSizes& n, T scale, bool causal) {
  const int64_t heads = n.batch * n.heads, D = n.head_dim, Tq = n.queries, Tk = n.keys;
  const int threads = cpu::threads_for(heads * Tq * Tk * D / 8);
  cpu::parallel_range(heads, threads, [&](int64_t begin, int64_t end) {
    std::vector<T> p(static_cast<size_t>(std::min(kBlock, Tq) * Tk));
    for (int64_t h = begin; h < end; ++h) {
      const T *qh = q.head(h, n.heads), *kh = k.head(h, n.heads), *vh = v.head(h, n.heads);
      T* oh = out.head(h, n.heads);
      for (int64_t i0 = 0; i0 < Tq; i0 += kBlock) {
        const int64_t m = std::min(kBlock, Tq - i0), seen = visible_keys(i0 + m - 1, n, causal);
        block_weights(qh, q.row_stride, kh, k.row_stride, i0, m, seen, n, scale, causal, p.data(),
                      lse + h * Tq + i0);
        cpu::gemm<T>(false, false, m, D, seen, p.data(), seen, vh, v.row_stride, T(0),
                     oh + i0 * out.row_stride, out.row_stride);
      }
    }
  });
}

// Block by block of queries, with P the weights rebuilt from q and k and dP = dO v^T:
// dv += P^T dO, dS = scale P * (dP - rowsum(dO * O)), dq = dS k, dk += dS^T q. Blocks run in
// order, so dk and dv add their terms in one order.
template <typename T>
void attention_backward_heads(Heads<const T> go, Heads<const T> q, Heads<const T> k,
                              Heads<const T> v, Heads<const T> out, Heads<T> gq, Heads<T> gk,
                              Heads<T> gv, const AttentionSizes& n, T scale, bool causal) {
  const int64_t heads = n.batch * n.heads, D = n.head_dim, Tq = n.queries, Tk = n.keys;
  const int threads = cpu::threads_for(heads * Tq * Tk * D / 4);
  cpu::parallel_range(heads, threads, [&](int64_t begin, int64_t end) {
    const size_t block = static_cast<size_t>(std::min(kBlock, Tq) * Tk);
    std::vector<T> p(block), ds(block);
    for (int64_t h = begin; h < end; ++h) {
      const T *qh = q.head(h, n.heads), *kh = k.head(h, n.heads), *vh = v.head(h, n.heads);
      const T *goh = go.head(h, n.heads), *oh = out.head(h, n.heads);
      T *gqh = gq.head(h, n.heads), *gkh = gk.head(h, n.heads), *gvh = gv.head(h, n.heads);
      for (int64_t j = 0; j < Tk; ++j) {
        std::fill(gkh + j * gk.row_stride, gkh + j * gk.row_stride + D, T(0));
        std::fill(gvh + j * gv.row_stride, gvh + j * gv.row_stride + D, T(0));
      }
      for (int64_t i0 = 0; i0 < Tq; i0 += kBlock) {
        const int64_t m = std::min(kBlock, Tq - i0), seen = visible_keys(i0 + m - 1, n, causal);
        const T* go_block = goh + i0 * go.row_stride;
        block_weights(qh, q.row_stride, kh, k.row_stride, i0, m, seen, n, scale, causal, p.data(),
                      static_cast<T*>(nullptr));
        cpu::gemm<T>(false, true, m, seen, D, go_block, go.row_stride, vh, v.row_stride, T(0),
                     ds.data(), seen);
        for (int64_t r = 0; r < m; ++r) {
          const T* gor = go_block + r * go.row_stride;
          const T* orow = oh + (i0 + r) * out.row_stride;
          const T row_dot = cpu::lane_sum<T>(D, [&](int64_t d) { return gor[d] * orow[d]; });
          const T* pr = p.data() + r * seen;
          T* dsr = ds.data() + r * seen;
          for (int64_t j = 0; j < seen; ++j) dsr[j] = pr[j] * (dsr[j] - row_dot) * scale;
        }
        cpu::gemm<T>(false, false, m, D, seen, ds.data(), seen, kh, k.row_stride, T(0),
                     gqh + i0 * gq.row_stride, gq.row_stride);
        cpu::gemm<T>(true, false, seen, D, m, ds.data(), seen, qh + i0 * q.row_stride, q.row_stride,
                     T(1), gkh, gk.row_stride);
        cpu::gemm<T>(true, false, seen, D, m, p.data(), seen, go_block, go.row_stride, T(1), gvh,
                     gv.row_stride);
      }
    }
  });
}

// The dtype the CPU computes attention in: f64 for f64, f32 for the rest.
DType compute_dtype(DType inputs) {
  return inputs == DType::f64 ? DType::f64 : DType::f32;
}

}  // namespace

void CpuBackend::attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, double scale,
                           bool causal, const Tensor& out, const Tensor& lse) {
  const AttentionSizes n = check_attention("attention", q_in, k_in, v_in, lse, causal, {&out});
  if (n.batch * n.heads * n.queries == 0) return;
  const DType dt = compute_dtype(q_in.dtype());
  const Tensor q = in_dtype(q_in, dt), k = in_dtype(k_in, dt), v = in_dtype(v_in, dt);
  const Tensor o = target(out, dt);
  PIPIT_DISPATCH_FLOAT(dt, "attention", {
    using T = scalar_t;
    attention_forward<T>(heads_of<const T>(q), heads_of<const T>(k), heads_of<const T>(v),
                         heads_of<T>(o), lse.data<T>(), n, static_cast<T>(scale), causal);
  });
  write_back(o, out);
}

void CpuBackend::attention_backward(const Tensor& grad_out, const Tensor& q_in, const Tensor& k_in,
                                    const Tensor& v_in, const Tensor& out_in, const Tensor& lse,
                                    double scale, bool causal, const Tensor& grad_q,
                                    const Tensor& grad_k, const Tensor& grad_v) {
  const char* op = "attention_backward";
  const AttentionSizes n =
      check_attention(op, q_in, k_in, v_in, lse, causal, {&grad_q, &grad_k, &grad_v});
  check_attention(op, q_in, k_in, v_in, lse, causal, {&out_in});
  check_attention(op, q_in, k_in, v_in, lse, causal, {&grad_out});
  if (n.batch * n.heads == 0) return;
  const DType dt = compute_dtype(q_in.dtype());
  const Tensor q = in_dtype(q_in, dt), k = in_dtype(k_in, dt), v = in_dtype(v_in, dt);
  const Tensor go = in_dtype(grad_out, dt), out = in_dtype(out_in, dt);
  const Tensor gq = target(grad_q, dt), gk = target(grad_k, dt), gv = target(grad_v, dt);
  PIPIT_DISPATCH_FLOAT(dt, op, {
    using T = scalar_t;
    attention_backward_heads<T>(heads_of<const T>(go), heads_of<const T>(q), heads_of<const T>(k),
                                heads_of<const T>(v), heads_of<const T>(out), heads_of<T>(gq),
                                heads_of<T>(gk), heads_of<T>(gv), n, static_cast<T>(scale), causal);
  });
  write_back(gq, grad_q);
  write_back(gk, grad_k);
  write_back(gv, grad_v);
}

}  // namespace pipit
