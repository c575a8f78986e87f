// Fused neural-network kernels: softmax, layer norm, embedding, cross-entropy.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/loop.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/kernel_layout.h"

namespace pipit {
namespace {

// Runs rows(begin, end) over `rows` rows of `cols` elements each, in parallel when large.
template <typename Body>
void for_rows(int64_t rows, int64_t cols, Body&& body) {
  cpu::parallel_range(rows, cpu::threads_for(rows * cols * 4), body);
}

template <typename T>
void softmax_rows(const T* x, T* y, int64_t rows, int64_t C, bool log) {
  for_rows(rows, C, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * C;
      T* yr = y + r * C;
      const T mx = cpu::lane_max(xr, C);
      cpu::exp_shifted(xr, mx, yr, C);
      const T sum = cpu::lane_sum<T>(C, [&](int64_t c) { return yr[c]; });
      if (log) {
        T lse = mx + std::log(sum);
        for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] - lse;
      } else {
        T inv = T(1) / sum;
        for (int64_t c = 0; c < C; ++c) yr[c] *= inv;
      }
    }
  });
}

template <typename T>
void softmax_backward_rows(const T* g, const T* y, T* gx, int64_t rows, int64_t C, bool log) {
  for_rows(rows, C, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* gr = g + r * C;
      const T* yr = y + r * C;
      T* out = gx + r * C;
      if (log) {
        const T dot = cpu::lane_sum<T>(C, [&](int64_t c) { return gr[c]; });
        for (int64_t c = 0; c < C; ++c) out[c] = gr[c] - cpu::exp_of(yr[c]) * dot;
      } else {
        const T dot = cpu::lane_sum<T>(C, [&](int64_t c) { return gr[c] * yr[c]; });
        for (int64_t c = 0; c < C; ++c) out[c] = yr[c] * (gr[c] - dot);
      }
    }
  });
}

// Rows of [..., T, T] scores: row r is query r % T, which sees keys 0..r % T.
template <typename T>
void causal_softmax_rows(const T* x, T* y, int64_t rows, int64_t C, T scale) {
  for_rows(rows, C, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t visible = r % C + 1;
      const T* xr = x + r * C;
      T* yr = y + r * C;
      for (int64_t c = 0; c < visible; ++c) yr[c] = xr[c] * scale;
      const T mx = cpu::lane_max(yr, visible);
      cpu::exp_shifted(yr, mx, yr, visible);
      const T sum = cpu::lane_sum<T>(visible, [&](int64_t c) { return yr[c]; });
      const T inv = T(1) / sum;
      for (int64_t c = 0; c < visible; ++c) yr[c] *= inv;
      std::fill(yr + visible, yr + C, T(0));
    }
  });
}

template <typename T>
void causal_softmax_backward_rows(const T* g, const T* y, T* gx, int64_t rows, int64_t C, T scale) {
  for_rows(rows, C, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t visible = r % C + 1;
      const T* gr = g + r * C;
      const T* yr = y + r * C;
      T* out = gx + r * C;
      const T dot = cpu::lane_sum<T>(visible, [&](int64_t c) { return gr[c] * yr[c]; });
      for (int64_t c = 0; c < visible; ++c) out[c] = yr[c] * (gr[c] - dot) * scale;
      std::fill(out + visible, out + C, T(0));
    }
  });
}

// Runs a row kernel on contiguous rows along `dim`, copying in and out only when needed.
template <typename Kernel>
void along_dim(const std::vector<Tensor>& inputs, const Tensor& out, int64_t dim, Kernel kernel) {
  std::vector<Tensor> rows;
  for (const Tensor& t : inputs) rows.push_back(dense(dim_last(t, dim)));
  Tensor out_view = dim_last(out, dim);
  Tensor out_rows =
      out_view.is_contiguous() ? out_view : Tensor::empty(out_view.shape(), out.dtype());
  const int64_t C = out.shape()[dim];
  kernel(rows, out_rows, C == 0 ? 0 : out.numel() / C, C);
  if (!out_rows.same_storage(out)) backend(out).copy(out_rows, out_view);
}

}  // namespace

void CpuBackend::softmax(const Tensor& in, int64_t dim, bool log, const Tensor& out) {
  PIPIT_DISPATCH_FLOAT(in.dtype(), "softmax", {
    along_dim({in}, out, dim, [&](auto& rows, const Tensor& o, int64_t R, int64_t C) {
      softmax_rows<scalar_t>(rows[0].template data<scalar_t>(), o.data<scalar_t>(), R, C, log);
    });
  });
}

void CpuBackend::softmax_backward(const Tensor& grad, const Tensor& out, int64_t dim, bool log,
                                  const Tensor& grad_in) {
  PIPIT_DISPATCH_FLOAT(out.dtype(), "softmax_backward", {
    along_dim({grad, out}, grad_in, dim, [&](auto& rows, const Tensor& o, int64_t R, int64_t C) {
      softmax_backward_rows<scalar_t>(rows[0].template data<scalar_t>(),
                                      rows[1].template data<scalar_t>(), o.data<scalar_t>(), R, C,
                                      log);
    });
  });
}

void CpuBackend::causal_softmax(const Tensor& scores, double scale, const Tensor& out) {
  check_causal_softmax("causal_softmax", scores, out);
  PIPIT_DISPATCH_FLOAT(scores.dtype(), "causal_softmax", {
    const Tensor x = dense(scores);
    const int64_t C = x.shape()[x.dim() - 1];
    if (x.numel() > 0) {
      causal_softmax_rows<scalar_t>(x.data<scalar_t>(), out.data<scalar_t>(), x.numel() / C, C,
                                    static_cast<scalar_t>(scale));
    }
  });
}

void CpuBackend::causal_softmax_backward(const Tensor& grad, const Tensor& out, double scale,
                                         const Tensor& grad_scores) {
  check_causal_softmax("causal_softmax_backward", out, grad_scores);
  PIPIT_DISPATCH_FLOAT(out.dtype(), "causal_softmax_backward", {
    const Tensor g = dense(grad), y = dense(out);
    const int64_t C = y.shape()[y.dim() - 1];
    if (y.numel() > 0) {
      causal_softmax_backward_rows<scalar_t>(g.data<scalar_t>(), y.data<scalar_t>(),
                                             grad_scores.data<scalar_t>(), y.numel() / C, C,
                                             static_cast<scalar_t>(scale));
    }
  });
}

void CpuBackend::layer_norm(const Tensor& x_in, const Tensor& weight, const Tensor& bias,
                            double eps, const Tensor& out, const Tensor& mean_out,
                            const Tensor& rstd_out) {
  if (out.dtype() != x_in.dtype()) {
    PIPIT_CHECK(x_in.dtype() == DType::f32 && is_half(out.dtype()), "layer_norm: output ",
                out.dtype(), " for input ", x_in.dtype());
    return cpu::into_f32(out, [&](const Tensor& wide) {
      layer_norm(x_in, weight, bias, eps, wide, mean_out, rstd_out);
    });
  }
  PIPIT_DISPATCH_FLOAT(x_in.dtype(), "layer_norm", {
    using T = scalar_t;
    Tensor x = dense(x_in);
    const int64_t C = x.shape().back();
    const int64_t rows = C == 0 ? 0 : x.numel() / C;
    const T* px = x.data<T>();
    const T* w = weight.data<T>();
    const T* b = bias.data<T>();
    T* y = out.data<T>();
    T* mean = mean_out.data<T>();
    T* rstd = rstd_out.data<T>();
    for_rows(rows, C, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* xr = px + r * C;
        const T m = cpu::lane_sum<T>(C, [&](int64_t c) { return xr[c]; }) / T(C);
        const T var =
            cpu::lane_sum<T>(C, [&](int64_t c) { return (xr[c] - m) * (xr[c] - m); }) / T(C);
        T rs = T(1) / std::sqrt(var + T(eps));
        mean[r] = m;
        rstd[r] = rs;
        T* yr = y + r * C;
        for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * rs * w[c] + b[c];
      }
    });
  });
}

namespace {

// One row x of layer norm's backward, given its gradient g: its share of the weight and bias
// gradients into pw and pb, and its input's gradient (plus the residual's, where given) into gx.
template <typename T>
void layer_norm_backward_row(const T* x, const T* g, const T* w, T m, T rs, int64_t C, T* pw, T* pb,
                             T* gx, const T* res) {
  for (int64_t c = 0; c < C; ++c) {
    pw[c] += g[c] * ((x[c] - m) * rs);
    pb[c] += g[c];
  }
  const T sum_gw = cpu::lane_sum<T>(C, [&](int64_t c) { return g[c] * w[c]; }) / T(C);
  const T sum_gw_xhat =
      cpu::lane_sum<T>(C, [&](int64_t c) { return g[c] * w[c] * ((x[c] - m) * rs); }) / T(C);
  for (int64_t c = 0; c < C; ++c) {
    const T xhat = (x[c] - m) * rs;
    const T own = rs * (g[c] * w[c] - sum_gw - xhat * sum_gw_xhat);
    gx[c] = res ? res[c] + own : own;
  }
}

}  // namespace

void CpuBackend::layer_norm_backward(const Tensor& grad_in, const Tensor& x_in,
                                     const Tensor& weight, const Tensor& mean_in,
                                     const Tensor& rstd_in, const Tensor& residual,
                                     const Tensor& grad_x, const Tensor& grad_weight,
                                     const Tensor& grad_bias) {
  if (grad_in.dtype() != x_in.dtype()) {
    PIPIT_CHECK(x_in.dtype() == DType::f32 && is_half(grad_in.dtype()),
                "layer_norm_backward: gradient ", grad_in.dtype(), " for input ", x_in.dtype());
    return layer_norm_backward(cpu::widened(grad_in), x_in, weight, mean_in, rstd_in, residual,
                               grad_x, grad_weight, grad_bias);
  }
  check_layer_norm_residual("layer_norm_backward", residual, x_in);
  PIPIT_DISPATCH_FLOAT(x_in.dtype(), "layer_norm_backward", {
    using T = scalar_t;
    Tensor x = dense(x_in), g = dense(grad_in);
    const int64_t C = x.shape().back();
    const int64_t rows = C == 0 ? 0 : x.numel() / C;
    const T* px = x.data<T>();
    const T* pg = g.data<T>();
    const T* w = weight.data<T>();
    const T* mean = mean_in.data<T>();
    const T* rstd = rstd_in.data<T>();
    T* gx = grad_x.data<T>();
    const T* res = residual.defined() ? residual.data<T>() : nullptr;
    // Weight and bias gradients sum over rows in fixed blocks, combined in block order, so the
    // result is the same on any number of threads.
    constexpr int64_t kRowsPerBlock = 64;
    const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
    std::vector<T> partial_w(static_cast<size_t>(blocks * C), T(0));
    std::vector<T> partial_b(static_cast<size_t>(blocks * C), T(0));
    cpu::parallel_range(blocks, cpu::threads_for(rows * C * 4), [&](int64_t begin, int64_t end) {
      for (int64_t blk = begin; blk < end; ++blk) {
        T* pw = partial_w.data() + blk * C;
        T* pb = partial_b.data() + blk * C;
        for (int64_t r = blk * kRowsPerBlock; r < std::min(rows, (blk + 1) * kRowsPerBlock); ++r) {
          layer_norm_backward_row(px + r * C, pg + r * C, w, mean[r], rstd[r], C, pw, pb,
                                  gx + r * C, res ? res + r * C : nullptr);
        }
      }
    });
    T* gw = grad_weight.data<T>();
    T* gb = grad_bias.data<T>();
    std::fill(gw, gw + C, T(0));
    std::fill(gb, gb + C, T(0));
    for (int64_t blk = 0; blk < blocks; ++blk) {
      for (int64_t c = 0; c < C; ++c) {
        gw[c] += partial_w[blk * C + c];
        gb[c] += partial_b[blk * C + c];
      }
    }
  });
}

void CpuBackend::embedding(const Tensor& weight, const Tensor& indices_in, const Tensor& out) {
  Tensor indices = dense(indices_in);
  const int64_t V = weight.shape()[0], C = weight.shape()[1];
  const int64_t n = indices.numel();
  const int64_t* idx = indices.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    PIPIT_CHECK(idx[i] >= 0 && idx[i] < V, "embedding: index ", idx[i], " at position ", i,
                " is out of range for ", V, " rows");
  }
  const size_t row_bytes = static_cast<size_t>(C) * dtype_size(weight.dtype());
  const char* w = static_cast<const char*>(weight.raw_data());
  char* o = static_cast<char*>(out.raw_data());
  cpu::parallel_range(n, cpu::threads_for(n * C), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      std::memcpy(o + i * row_bytes, w + idx[i] * static_cast<int64_t>(row_bytes), row_bytes);
    }
  });
}

void CpuBackend::embedding_backward(const Tensor& grad_in, const Tensor& indices_in,
                                    const Tensor& grad_weight) {
  PIPIT_DISPATCH_FLOAT(grad_weight.dtype(), "embedding_backward", {
    using T = scalar_t;
    Tensor indices = dense(indices_in), g = dense(grad_in);
    const int64_t C = grad_weight.shape()[1];
    const int64_t n = indices.numel();
    const int64_t* idx = indices.data<int64_t>();
    const T* pg = g.data<T>();
    T* gw = grad_weight.data<T>();
    // Each thread owns a range of columns, so rows are added in index order on any thread count.
    cpu::parallel_range(C, cpu::threads_for(n * C), [&](int64_t begin, int64_t end) {
      for (int64_t i = 0; i < n; ++i) {
        T* row = gw + idx[i] * C;
        const T* src = pg + i * C;
        for (int64_t c = begin; c < end; ++c) row[c] += src[c];
      }
    });
  });
}

namespace {

// One row of logits in the compute type: the row itself, or for half logits its values
// widened into `buffer` (exactly), so the kernels never widen the whole [N, C] tensor.
template <typename S>
const cpu::compute_t<S>* row_in_compute_type(const S* row, int64_t C,
                                             std::vector<cpu::compute_t<S>>& buffer) {
  if constexpr (std::is_same_v<cpu::compute_t<S>, S>) {
    return row;
  } else {
    buffer.resize(C);
    for (int64_t c = 0; c < C; ++c) buffer[c] = cpu::compute_t<S>(row[c]);
    return buffer.data();
  }
}

template <typename T, typename G>
void round_row(const T* from, int64_t n, G* to) {
  for (int64_t c = 0; c < n; ++c) to[c] = G(from[c]);
}

// A row's max and the sum of exp(x - max), the exponentials left in exps: the one computation
// of both that cross_entropy and its backward share, so stats saved by one are the other's bits.
template <typename T>
void softmax_sums(const T* row, int64_t C, T* exps, T& mx, T& sum) {
  mx = row[0];
  for (int64_t c = 1; c < C; ++c) mx = std::max(mx, row[c]);
  cpu::exp_shifted(row, mx, exps, C);
  sum = 0;
  for (int64_t c = 0; c < C; ++c) sum += exps[c];
}

void check_targets(const int64_t* t, int64_t N, int64_t C, int64_t ignore_index) {
  for (int64_t i = 0; i < N; ++i) {
    PIPIT_CHECK(t[i] == ignore_index || (t[i] >= 0 && t[i] < C), "cross_entropy: target ", t[i],
                " at row ", i, " is out of range for ", C, " classes");
  }
}

}  // namespace

void CpuBackend::cross_entropy(const Tensor& logits_in, const Tensor& targets_in,
                               int64_t ignore_index, const Tensor& losses, const Tensor& stats) {
  check_cross_entropy_stats("cross_entropy", stats, logits_in);
  PIPIT_DISPATCH_FLOAT_AND_HALF(logits_in.dtype(), "cross_entropy", {
    using T = cpu::compute_t<scalar_t>;
    Tensor logits = unit_stride_rows(logits_in), targets = dense(targets_in);
    const int64_t N = logits.shape()[0], C = logits.shape()[1], ld = logits.strides()[0];
    const auto* x = static_cast<const scalar_t*>(logits.raw_data());
    const int64_t* t = targets.data<int64_t>();
    check_targets(t, N, C, ignore_index);
    // Half logits give an f32 loss: each row computed on its values widened.
    T* loss = losses.data<T>();
    T* row_stats = stats.defined() ? stats.data<T>() : nullptr;
    for_rows(N, C, [&](int64_t begin, int64_t end) {
      std::vector<T> buffer, exps(C);
      for (int64_t i = begin; i < end; ++i) {
        T mx = 0, sum = 0;
        if (t[i] == ignore_index) {
          loss[i] = 0;
        } else {
          const T* row = row_in_compute_type(x + i * ld, C, buffer);
          softmax_sums(row, C, exps.data(), mx, sum);
          loss[i] = mx + std::log(sum) - row[t[i]];
        }
        if (row_stats) {
          row_stats[2 * i] = mx;
          row_stats[2 * i + 1] = sum;
        }
      }
    });
  });
}

void CpuBackend::cross_entropy_backward(const Tensor& logits_in, const Tensor& targets_in,
                                        int64_t ignore_index, const Tensor& scale_in,
                                        const Tensor& stats_in, const Tensor& grad_logits) {
  check_cross_entropy_scale("cross_entropy_backward", scale_in, logits_in);
  check_cross_entropy_stats("cross_entropy_backward", stats_in, logits_in);
  PIPIT_DISPATCH_FLOAT_AND_HALF(logits_in.dtype(), "cross_entropy_backward", {
    using T = cpu::compute_t<scalar_t>;
    const T scale = dense(scale_in).data<T>()[0];
    Tensor logits = unit_stride_rows(logits_in), targets = dense(targets_in);
    PIPIT_CHECK(grad_logits.strides()[1] == 1,
                "cross_entropy_backward: the gradient's rows need unit stride");
    const int64_t N = logits.shape()[0], C = logits.shape()[1], ld = logits.strides()[0];
    const int64_t ldg = grad_logits.strides()[0];
    const auto* x = static_cast<const scalar_t*>(logits.raw_data());
    const int64_t* t = targets.data<int64_t>();
    const T* row_stats = stats_in.defined() ? stats_in.data<T>() : nullptr;
    check_targets(t, N, C, ignore_index);
    // A gradient in the compute type is written in place; a half one is computed in f32 and
    // rounded once per row.
    const bool in_place = !is_half(grad_logits.dtype());
    char* g = static_cast<char*>(grad_logits.raw_data());
    const int64_t g_row_bytes = ldg * static_cast<int64_t>(dtype_size(grad_logits.dtype()));
    for_rows(N, C, [&](int64_t begin, int64_t end) {
      std::vector<T> buffer, wide_gradient(in_place ? 0 : C);
      for (int64_t i = begin; i < end; ++i) {
        T* gr = in_place ? reinterpret_cast<T*>(g + i * g_row_bytes) : wide_gradient.data();
        if (t[i] == ignore_index) {
          std::fill(gr, gr + C, T(0));
        } else {
          const T* row = row_in_compute_type(x + i * ld, C, buffer);
          T mx, sum;
          if (row_stats) {
            mx = row_stats[2 * i];
            sum = row_stats[2 * i + 1];
            cpu::exp_shifted(row, mx, gr, C);
          } else {
            softmax_sums(row, C, gr, mx, sum);
          }
          const T inv = scale / sum;
          for (int64_t c = 0; c < C; ++c) gr[c] *= inv;
          gr[t[i]] -= scale;
        }
        if (!in_place && grad_logits.dtype() == DType::bf16) {
          round_row(gr, C, reinterpret_cast<cpu::BFloat16*>(g + i * g_row_bytes));
        } else if (!in_place) {
          round_row(gr, C, reinterpret_cast<cpu::Half*>(g + i * g_row_bytes));
        }
      }
    });
  });
}

}  // namespace pipit
