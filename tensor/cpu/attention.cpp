// Fused attention on the CPU. Each (batch, head) runs on one thread, one query at a time: the
// query's scores fill one row of Tk values, never the [Tq, Tk] weights. Every sum runs in one
// fixed order whatever the thread count, so the bits do not depend on it. Half inputs widen to
// f32 (exactly), as the CPU's half GEMM does.
#include <cmath>
#include <limits>
#include <vector>

#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/loop.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/kernel_layout.h"

namespace pipit {
namespace {

// y = e^(x - shift) over n elements, vectorised for float.
void exp_shifted(const float* x, float shift, float* y, int64_t n) {
  cpu::exp_shifted_row(x, shift, y, n);
}
void exp_shifted(const double* x, double shift, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i] - shift);
}

// t as a contiguous tensor of dtype `dtype`: t itself when it already is one.
Tensor staged(const Tensor& t, DType dtype) {
  if (t.is_contiguous() && t.dtype() == dtype) return t;
  Tensor out = Tensor::empty(t.shape(), dtype);
  backend(t).copy(t, out);
  return out;
}

// Where a kernel writes `out`: out itself when contiguous of `dtype`, else a buffer that
// write_back copies (and rounds) into out.
Tensor target(const Tensor& out, DType dtype) {
  return out.is_contiguous() && out.dtype() == dtype ? out : Tensor::empty(out.shape(), dtype);
}
void write_back(const Tensor& buffer, const Tensor& out) {
  if (!buffer.same_storage(out)) backend(out).copy(buffer, out);
}

// Keys query i sees: all Tk, or 0..i + Tk - Tq when causal.
int64_t visible_keys(int64_t i, const AttentionSizes& n, bool causal) {
  return causal ? i + n.keys - n.queries + 1 : n.keys;
}

// k of one head, transposed to [D, Tk] so a query's scores vectorise over keys.
template <typename T>
void transpose_head(const T* x, int64_t rows, int64_t D, std::vector<T>& xt) {
  xt.resize(static_cast<size_t>(rows * D));
  for (int64_t j = 0; j < rows; ++j) {
    for (int64_t d = 0; d < D; ++d) xt[static_cast<size_t>(d * rows + j)] = x[j * D + d];
  }
}

// s[0, n) = scale * (q . k_j), from kt = k^T [D, Tk]; d runs outermost, as in every call.
template <typename T>
void scores(const T* q, const std::vector<T>& kt, int64_t Tk, int64_t D, int64_t n, T scale, T* s) {
  std::fill(s, s + n, T(0));
  for (int64_t d = 0; d < D; ++d) {
    const T qd = q[d];
    const T* row = kt.data() + d * Tk;
    for (int64_t j = 0; j < n; ++j) s[j] += qd * row[j];
  }
  for (int64_t j = 0; j < n; ++j) s[j] *= scale;
}

template <typename T>
void attention_forward(const T* q, const T* k, const T* v, T* out, T* lse, const AttentionSizes& n,
                       T scale, bool causal) {
  const int64_t heads = n.batch * n.heads, D = n.head_dim, Tq = n.queries, Tk = n.keys;
  const int threads = cpu::threads_for(heads * Tq * Tk * D / 8);
  cpu::parallel_range(heads, threads, [&](int64_t begin, int64_t end) {
    std::vector<T> kt, s(static_cast<size_t>(Tk)), acc(static_cast<size_t>(D));
    for (int64_t h = begin; h < end; ++h) {
      const T* qh = q + h * Tq * D;
      const T* vh = v + h * Tk * D;
      T* oh = out + h * Tq * D;
      transpose_head(k + h * Tk * D, Tk, D, kt);
      for (int64_t i = 0; i < Tq; ++i) {
        const int64_t seen = visible_keys(i, n, causal);
        scores(qh + i * D, kt, Tk, D, seen, scale, s.data());
        const T mx = cpu::lane_max(s.data(), seen);
        exp_shifted(s.data(), mx, s.data(), seen);
        const T sum = cpu::lane_sum<T>(seen, [&](int64_t j) { return s[static_cast<size_t>(j)]; });
        std::fill(acc.begin(), acc.end(), T(0));
        for (int64_t j = 0; j < seen; ++j) {
          const T p = s[static_cast<size_t>(j)];
          const T* vj = vh + j * D;
          for (int64_t d = 0; d < D; ++d) acc[static_cast<size_t>(d)] += p * vj[d];
        }
        const T inv = T(1) / sum;
        for (int64_t d = 0; d < D; ++d) oh[i * D + d] = acc[static_cast<size_t>(d)] * inv;
        lse[h * Tq + i] = mx + std::log(sum);
      }
    }
  });
}

// With P = softmax weights rebuilt from lse and dP = dO v^T: dv = P^T dO, dS = P * (dP -
// rowsum(dO * O)), dq = scale dS k, dk = scale dS^T q; queries are visited in order, so dk and
// dv add their terms in query order.
template <typename T>
void attention_backward_heads(const T* go, const T* q, const T* k, const T* v, const T* out,
                              const T* lse, T* gq, T* gk, T* gv, const AttentionSizes& n, T scale,
                              bool causal) {
  const int64_t heads = n.batch * n.heads, D = n.head_dim, Tq = n.queries, Tk = n.keys;
  const int threads = cpu::threads_for(heads * Tq * Tk * D / 4);
  cpu::parallel_range(heads, threads, [&](int64_t begin, int64_t end) {
    std::vector<T> kt, vt, p(static_cast<size_t>(Tk)), dp(static_cast<size_t>(Tk));
    for (int64_t h = begin; h < end; ++h) {
      const T *qh = q + h * Tq * D, *kh = k + h * Tk * D, *vh = v + h * Tk * D;
      const T *goh = go + h * Tq * D, *oh = out + h * Tq * D;
      T *gqh = gq + h * Tq * D, *gkh = gk + h * Tk * D, *gvh = gv + h * Tk * D;
      transpose_head(kh, Tk, D, kt);
      transpose_head(vh, Tk, D, vt);
      std::fill(gkh, gkh + Tk * D, T(0));
      std::fill(gvh, gvh + Tk * D, T(0));
      for (int64_t i = 0; i < Tq; ++i) {
        const int64_t seen = visible_keys(i, n, causal);
        const T* goi = goh + i * D;
        const T* qi = qh + i * D;
        const T row_dot = cpu::lane_sum<T>(D, [&](int64_t d) { return goi[d] * oh[i * D + d]; });
        scores(qi, kt, Tk, D, seen, scale, p.data());
        exp_shifted(p.data(), lse[h * Tq + i], p.data(), seen);
        // dp_j = dO_i . v_j, vectorised over keys as the scores are.
        scores(goi, vt, Tk, D, seen, T(1), dp.data());
        T* gqi = gqh + i * D;
        std::fill(gqi, gqi + D, T(0));
        for (int64_t j = 0; j < seen; ++j) {
          const T pj = p[static_cast<size_t>(j)];
          const T ds = pj * (dp[static_cast<size_t>(j)] - row_dot) * scale;
          const T* kj = kh + j * D;
          T* gkj = gkh + j * D;
          T* gvj = gvh + j * D;
          for (int64_t d = 0; d < D; ++d) {
            gqi[d] += ds * kj[d];
            gkj[d] += ds * qi[d];
            gvj[d] += pj * goi[d];
          }
        }
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
  const Tensor q = staged(q_in, dt), k = staged(k_in, dt), v = staged(v_in, dt);
  const Tensor o = target(out, dt);
  PIPIT_DISPATCH_FLOAT(dt, "attention", {
    attention_forward<scalar_t>(q.data<scalar_t>(), k.data<scalar_t>(), v.data<scalar_t>(),
                                o.data<scalar_t>(), lse.data<scalar_t>(), n,
                                static_cast<scalar_t>(scale), causal);
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
  const Tensor q = staged(q_in, dt), k = staged(k_in, dt), v = staged(v_in, dt);
  const Tensor go = staged(grad_out, dt), out = staged(out_in, dt);
  const Tensor gq = target(grad_q, dt), gk = target(grad_k, dt), gv = target(grad_v, dt);
  PIPIT_DISPATCH_FLOAT(dt, op, {
    attention_backward_heads<scalar_t>(
        go.data<scalar_t>(), q.data<scalar_t>(), k.data<scalar_t>(), v.data<scalar_t>(),
        out.data<scalar_t>(), lse.data<scalar_t>(), gq.data<scalar_t>(), gk.data<scalar_t>(),
        gv.data<scalar_t>(), n, static_cast<scalar_t>(scale), causal);
  });
  write_back(gq, grad_q);
  write_back(gk, grad_k);
  write_back(gv, grad_v);
}

}  // namespace pipit
