// Fused attention on the CPU. Each (batch, head) runs on one thread, kBlock queries at a
// time: the block's weights ([kBlock, Tk], in cache) are the only weights held, never the
// whole [Tq, Tk]; the products are single-threaded GEMM calls (tensor/cpu/gemm.h) on the
// operands' rows where they lie (a packed projection's heads are not copied), whose sizes
// depend only on the shapes, so the bits do not depend on the thread count. The backward
// rebuilds the weights with the forward's own code rather than from lse. Half inputs are
// computed on in f32: each head's rows are widened (exactly) as the head is taken up, and its
// results rounded once as it is left, so no whole operand is ever copied. bf16 heads on a CPU
// with AVX512_BF16 take their own path at the end of this file, on the bf16 dot product.
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

// Scores p [m, seen] of queries [i0, i0 + m) of one head (seen = the last query's visible keys)
// turned into their softmax weights in place: scaled, masked to 0 past each query's diagonal.
// lse, when given, gets each row's log-sum-exp.
template <typename T>
void softmax_rows(T* p, int64_t i0, int64_t m, int64_t seen, const AttentionSizes& n, T scale,
                  bool causal, T* lse) {
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

// The softmax weights of queries [i0, i0 + m) of one head, p [m, seen], from scores =
// q_block k^T. The forward and the backward both call this, so the backward's weights are the
// forward's bits.
template <typename T>
void block_weights(HeadRows<const T> q, HeadRows<const T> k, int64_t i0, int64_t m, int64_t seen,
                   const AttentionSizes& n, T scale, bool causal, T* p, T* lse) {
  cpu::gemm<T>(false, true, m, seen, n.head_dim, q.data + i0 * q.ld, q.ld, k.data, k.ld, T(0), p,
               seen);
  softmax_rows(p, i0, m, seen, n, scale, causal, lse);
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

// bf16 heads on the AVX512_BF16 dot product, as FlashAttention computes half heads: bf16
// products summed in f32, the softmax and dS in f32, the weights and dS rounded to bf16 for
// the products that take them, every result rounded once. Keys and values are packed once per
// head for the products that read them across; the products down a block's keys pack them per
// block, to its depth, so no key past the block's last visible one enters a sum.
bool on_bf16_dot(DType dtype, int64_t head_dim) {
  return dtype == DType::bf16 && cpu_bf16_dot() && head_dim % 2 == 0 && head_dim <= cpu::kBf16Depth;
}

using Bf16Heads = Heads<const cpu::BFloat16>;

const uint16_t* bits_of(const cpu::BFloat16* x) {
  return reinterpret_cast<const uint16_t*>(x);
}

// Panels 32 columns wide for a head dim that fits them (the kernel then runs 12 rows a tile).
int64_t panel_width(int64_t D) {
  return D <= 32 ? 32 : 64;
}

int64_t even(int64_t n) {
  return (n + 1) / 2 * 2;
}

// rows x cols of f32 x (rows ld_x apart) rounded to bf16 into out (ld_out apart).
void round_rows(const float* x, int64_t ld_x, int64_t rows, int64_t cols, cpu::BFloat16* out,
                int64_t ld_out) {
  for (int64_t r = 0; r < rows; ++r) cpu::round_run(x + r * ld_x, out + r * ld_out, 1, cols);
}

// rows x cols of f32 x rounded to bf16 as gemm_bf16_panels reads an A: rows of even(cols),
// the one past an odd cols zero.
void round_into_a(const float* x, int64_t rows, int64_t cols, cpu::BFloat16* out) {
  round_rows(x, cols, rows, cols, out, even(cols));
  for (int64_t r = 0; r < rows && cols % 2 == 1; ++r) out[r * even(cols) + cols].bits = 0;
}

// The softmax weights of queries [i0, i0 + m) from their scores p [m, seen] and the forward's
// log-sum-exp: one exp per score, without the forward's max, sum and division. They may differ
// from the forward's weights in their last bits, which the products' bf16 factors do not keep.
void weights_from_lse(float* p, const float* lse, int64_t i0, int64_t m, int64_t seen,
                      const AttentionSizes& n, float scale, bool causal) {
  for (int64_t r = 0; r < m; ++r) {
    float* row = p + r * seen;
    const int64_t visible = visible_keys(i0 + r, n, causal);
    for (int64_t j = 0; j < visible; ++j) row[j] *= scale;
    cpu::exp_shifted(row, lse[r], row, visible);
    std::fill(row + visible, row + seen, 0.0f);
  }
}

// One product of attention_backward_bf16 that runs transposed, so that its N is the keys:
// sums^T [D, Tk] += rows^T weights, rows [m, D] (q or dO, where they lie), weights [m, seen].
void add_transposed(const uint16_t* rows, int64_t ld, const cpu::BFloat16* weights, int64_t m,
                    int64_t seen, int64_t D, cpu::Bf16Panels& rows_by_pair,
                    cpu::Bf16Panels& weight_panels, float* sums, int64_t Tk) {
  cpu::pack_bf16(false, m, D, rows, ld, D, rows_by_pair);
  cpu::pack_bf16(false, m, seen, bits_of(weights), even(seen), 64, weight_panels);
  const auto* a = reinterpret_cast<const uint16_t*>(rows_by_pair.words.data());
  cpu::gemm_bf16_panels(D, seen, a, 2, 2 * D, weight_panels, 1.0f, sums, Tk);
}

void attention_forward_bf16(Bf16Heads q, Bf16Heads k, Bf16Heads v, Heads<cpu::BFloat16> out,
                            float* lse, const AttentionSizes& n, float scale, bool causal) {
  const int64_t heads = n.batch * n.heads, D = n.head_dim, Tq = n.queries, Tk = n.keys;
  const int threads = cpu::threads_for(heads * Tq * Tk * D / 8);
  cpu::parallel_range(heads, threads, [&](int64_t begin, int64_t end) {
    const int64_t block = std::min(kBlock, Tq);
    std::vector<float> p(static_cast<size_t>(block * Tk)),
        block_out(static_cast<size_t>(block * D));
    std::vector<cpu::BFloat16> p16(static_cast<size_t>(block * even(Tk)));
    cpu::Bf16Panels keys, values;
    for (int64_t h = begin; h < end; ++h) {
      const uint16_t* qh = bits_of(q.head(h, n.heads));
      cpu::pack_bf16(true, D, Tk, bits_of(k.head(h, n.heads)), k.row_stride, 64, keys);
      for (int64_t i0 = 0; i0 < Tq; i0 += kBlock) {
        const int64_t m = std::min(kBlock, Tq - i0), seen = visible_keys(i0 + m - 1, n, causal);
        cpu::gemm_bf16_panels(m, seen, qh + i0 * q.row_stride, q.row_stride, 2, keys, 0.0f,
                              p.data(), seen);
        softmax_rows(p.data(), i0, m, seen, n, scale, causal, lse + h * Tq + i0);
        round_into_a(p.data(), m, seen, p16.data());
        cpu::pack_bf16(false, seen, D, bits_of(v.head(h, n.heads)), v.row_stride, panel_width(D),
                       values);
        cpu::gemm_bf16_panels(m, D, bits_of(p16.data()), even(seen), 2, values, 0.0f,
                              block_out.data(), D);
        round_rows(block_out.data(), D, m, D, out.head(h, n.heads) + i0 * out.row_stride,
                   out.row_stride);
      }
    }
  });
}

// The backward of the above, block by block of queries as attention_backward_heads, its weights
// from lse. dk and dv are summed transposed, [D, Tk], and transposed back once per head.
void attention_backward_bf16(Bf16Heads go, Bf16Heads q, Bf16Heads k, Bf16Heads v, Bf16Heads out,
                             const float* lse, Heads<cpu::BFloat16> gq, Heads<cpu::BFloat16> gk,
                             Heads<cpu::BFloat16> gv, const AttentionSizes& n, float scale,
                             bool causal) {
  const int64_t heads = n.batch * n.heads, D = n.head_dim, Tq = n.queries, Tk = n.keys;
  const int threads = cpu::threads_for(heads * Tq * Tk * D / 4);
  cpu::parallel_range(heads, threads, [&](int64_t begin, int64_t end) {
    const int64_t block = std::min(kBlock, Tq);
    std::vector<float> p(static_cast<size_t>(block * Tk)), ds(p.size()),
        gq_block(static_cast<size_t>(block * D)), gk_sums(static_cast<size_t>(D * Tk)),
        gv_sums(gk_sums.size()), key_major(gk_sums.size());
    std::vector<cpu::BFloat16> ds16(static_cast<size_t>(block * even(Tk))), p16(ds16.size());
    cpu::Bf16Panels keys, values, key_rows, rows_by_pair, weight_panels;
    for (int64_t h = begin; h < end; ++h) {
      const uint16_t *qh = bits_of(q.head(h, n.heads)), *kh = bits_of(k.head(h, n.heads)),
                     *goh = bits_of(go.head(h, n.heads));
      const cpu::BFloat16* oh = out.head(h, n.heads);
      cpu::pack_bf16(true, D, Tk, kh, k.row_stride, 64, keys);
      cpu::pack_bf16(true, D, Tk, bits_of(v.head(h, n.heads)), v.row_stride, 64, values);
      std::fill(gk_sums.begin(), gk_sums.end(), 0.0f);
      std::fill(gv_sums.begin(), gv_sums.end(), 0.0f);
      for (int64_t i0 = 0; i0 < Tq; i0 += kBlock) {
        const int64_t m = std::min(kBlock, Tq - i0), seen = visible_keys(i0 + m - 1, n, causal);
        const uint16_t *q_block = qh + i0 * q.row_stride, *go_block = goh + i0 * go.row_stride;
        cpu::gemm_bf16_panels(m, seen, q_block, q.row_stride, 2, keys, 0.0f, p.data(), seen);
        weights_from_lse(p.data(), lse + h * Tq + i0, i0, m, seen, n, scale, causal);
        cpu::gemm_bf16_panels(m, seen, go_block, go.row_stride, 2, values, 0.0f, ds.data(), seen);
        for (int64_t r = 0; r < m; ++r) {
          const uint16_t* gor = go_block + r * go.row_stride;
          const cpu::BFloat16* orow = oh + (i0 + r) * out.row_stride;
          const float row_dot = cpu::lane_sum<float>(D, [&](int64_t d) {
            return bfloat16_to_float(gor[d]) * bfloat16_to_float(orow[d].bits);
          });
          const float* pr = p.data() + r * seen;
          float* dsr = ds.data() + r * seen;
          for (int64_t j = 0; j < seen; ++j) dsr[j] = pr[j] * (dsr[j] - row_dot) * scale;
        }
        round_into_a(ds.data(), m, seen, ds16.data());
        round_into_a(p.data(), m, seen, p16.data());
        cpu::pack_bf16(false, seen, D, kh, k.row_stride, panel_width(D), key_rows);
        cpu::gemm_bf16_panels(m, D, bits_of(ds16.data()), even(seen), 2, key_rows, 0.0f,
                              gq_block.data(), D);
        round_rows(gq_block.data(), D, m, D, gq.head(h, n.heads) + i0 * gq.row_stride,
                   gq.row_stride);
        add_transposed(q_block, q.row_stride, ds16.data(), m, seen, D, rows_by_pair, weight_panels,
                       gk_sums.data(), Tk);
        add_transposed(go_block, go.row_stride, p16.data(), m, seen, D, rows_by_pair, weight_panels,
                       gv_sums.data(), Tk);
      }
      for (auto [sums, grad] : {std::pair{&gk_sums, gk}, std::pair{&gv_sums, gv}}) {
        cpu::transpose_words(sums->data(), 4 * Tk, D, Tk, key_major.data(), 4 * D);
        round_rows(key_major.data(), D, Tk, D, grad.head(h, n.heads), grad.row_stride);
      }
    }
  });
}

}  // namespace

void CpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                           bool causal, const Tensor& out, const Tensor& lse) {
  const AttentionSizes n = check_attention("attention", q, k, v, lse, causal, {&out});
  if (n.batch * n.heads * n.queries == 0) return;
  if (on_bf16_dot(q.dtype(), n.head_dim)) {
    return attention_forward_bf16(heads_of<const cpu::BFloat16>(q),
                                  heads_of<const cpu::BFloat16>(k),
                                  heads_of<const cpu::BFloat16>(v), heads_of<cpu::BFloat16>(out),
                                  lse.data<float>(), n, static_cast<float>(scale), causal);
  }
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
  if (on_bf16_dot(q.dtype(), n.head_dim)) {
    using B = cpu::BFloat16;
    return attention_backward_bf16(
        heads_of<const B>(grad_out), heads_of<const B>(q), heads_of<const B>(k),
        heads_of<const B>(v), heads_of<const B>(out), lse.data<float>(), heads_of<B>(grad_q),
        heads_of<B>(grad_k), heads_of<B>(grad_v), n, static_cast<float>(scale), causal);
  }
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
