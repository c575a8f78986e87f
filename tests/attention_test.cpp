// scaled_dot_product_attention (the fused kernel) against attention written out with matmul,
// masked_fill and softmax, forward and backward; finite differences; views; determinism;
// autocast; and the transformer's use of it.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>

#include "bitwise.h"
#include "gradcheck.h"
#include "graph_names.h"
#include "nn/builders.h"
#include "nn/transformer.h"
#include "pipit.h"
#include "tensor/backend.h"
#include "tensor/cpu/cpu_backend.h"

using namespace pipit;
using testing::max_abs_difference;

namespace {

// softmax(scale q k^T, masked) v as separate ops; with causal, key j is hidden from query i
// when j > i + Tk - Tq.
Tensor written_out(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  Tensor scores = matmul(q, transpose(k, -1, -2)) * scale;
  if (causal) {
    const int64_t Tq = q.shape()[2], Tk = k.shape()[2];
    // Query i's last visible key, i + Tk - Tq.
    const Tensor last_seen =
        arange(static_cast<double>(Tk - Tq), static_cast<double>(Tk), 1.0, {DType::i64});
    const Tensor keys = arange(0, static_cast<double>(Tk), 1.0, {DType::i64});
    const Tensor hidden = gt(reshape(keys, {1, Tk}), reshape(last_seen, {Tq, 1}));
    scores = masked_fill(scores, hidden, -INFINITY);
  }
  return matmul(softmax(scores, -1), v);
}

bool same_values(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.to_vector<double>() == b.to_vector<double>();
}

}  // namespace

TEST_CASE("attention equals softmax(scale q k^T) v written out, forward and backward", "[nn]") {
  Generator g(41);
  for (const auto& [dtype, tol] : {std::pair{DType::f64, 1e-12}, std::pair{DType::f32, 2e-5}}) {
    for (bool causal : {true, false}) {
      // (Tq, Tk): square, a single query, more keys than queries (a KV cache's step).
      for (const auto& [Tq, Tk] :
           {std::pair<int64_t, int64_t>{7, 7}, {1, 1}, {33, 33}, {1, 9}, {5, 12}, {12, 5}}) {
        if (causal && Tq > Tk) continue;
        for (int64_t D : {4, 16}) {
          INFO(dtype << (causal ? " causal" : " full") << ", Tq " << Tq << ", Tk " << Tk << ", D "
                     << D);
          const Tensor q = uniform({2, 3, Tq, D}, -2, 2, &g, {dtype});
          const Tensor k = uniform({2, 3, Tk, D}, -2, 2, &g, {dtype});
          const Tensor v = uniform({2, 3, Tk, D}, -2, 2, &g, {dtype});
          const Tensor grad = uniform({2, 3, Tq, D}, -1, 1, &g, {dtype});
          const double scale = 0.3;
          std::vector<Tensor> want_in, got_in;
          for (const Tensor& t : {q, k, v}) {
            want_in.push_back(t.clone().requires_grad_());
            got_in.push_back(t.clone().requires_grad_());
          }
          const Tensor want = written_out(want_in[0], want_in[1], want_in[2], causal, scale);
          const Tensor got =
              scaled_dot_product_attention(got_in[0], got_in[1], got_in[2], causal, scale);
          CHECK(max_abs_difference(got, want) <= tol);
          want.backward(grad);
          got.backward(grad);
          for (int i = 0; i < 3; ++i) {
            INFO("gradient of input " << i);
            CHECK(max_abs_difference(got_in[i].grad(), want_in[i].grad()) <= tol);
          }
        }
      }
    }
  }
}

TEST_CASE("attention's gradients match finite differences", "[nn][gradcheck]") {
  using V = std::vector<Tensor>;
  testing::check_gradients(
      [](const V& x) { return scaled_dot_product_attention(x[0], x[1], x[2], true); },
      testing::leaves({{1, 2, 5, 3}, {1, 2, 5, 3}, {1, 2, 5, 3}}));
  testing::check_gradients(
      [](const V& x) { return scaled_dot_product_attention(x[0], x[1], x[2], true, 0.7); },
      testing::leaves({{2, 1, 3, 4}, {2, 1, 6, 4}, {2, 1, 6, 4}}, 8));
  testing::check_gradients(
      [](const V& x) { return scaled_dot_product_attention(x[0], x[1], x[2], false); },
      testing::leaves({{1, 2, 4, 3}, {1, 2, 6, 3}, {1, 2, 6, 3}}, 9));
}

TEST_CASE("attention reads q, k, v as views of a packed projection and merges heads free", "[nn]") {
  Generator g(42);
  const int64_t B = 2, T = 9, H = 3, D = 4;
  // [B, T, 3, H, D] -> [3, B, H, T, D], as CausalSelfAttention splits its qkv projection.
  const Tensor packed = uniform({B, T, 3, H, D}, -2, 2, &g);
  const Tensor heads = permute(packed, {2, 0, 3, 1, 4});
  const Tensor q = squeeze(narrow(heads, 0, 0, 1), 0), k = squeeze(narrow(heads, 0, 1, 1), 0),
               v = squeeze(narrow(heads, 0, 2, 1), 0);
  REQUIRE_FALSE(q.is_contiguous());
  const Tensor from_views = scaled_dot_product_attention(q, k, v, true);
  const Tensor from_copies =
      scaled_dot_product_attention(q.contiguous(), k.contiguous(), v.contiguous(), true);
  CHECK(same_values(from_views, from_copies));
  // The result is [B, H, T, D] over [B, T, H, D] memory: the heads merge without a copy.
  const Tensor merged = permute(from_views, {0, 2, 1, 3});
  CHECK(merged.is_contiguous());
  CHECK(merged.same_storage(from_views));
}

TEST_CASE("packed self-attention gives the split heads' bits and one gradient tensor", "[nn]") {
  Generator g(46);
  const int64_t B = 2, T = 9, H = 3, D = 4;
  for (DType dtype : {DType::f32, DType::f64}) {
    for (bool causal : {true, false}) {
      INFO(dtype << (causal ? " causal" : " full"));
      const Tensor qkv = uniform({B, T, 3 * H * D}, -2, 2, &g).to(dtype);
      const Tensor grad = uniform({B, H, T, D}, -1, 1, &g).to(dtype);
      const Tensor packed = qkv.clone().requires_grad_(), split = qkv.clone().requires_grad_();
      const Tensor got = packed_self_attention(packed, H, causal);
      const auto [q, k, v] = split_packed_heads(split, H);
      const Tensor want = scaled_dot_product_attention(q, k, v, causal);
      CHECK(same_values(got, want));
      got.backward(grad);
      want.backward(grad);
      CHECK(same_values(packed.grad(), split.grad()));
      // One node between the output and qkv: no zero-filled gradient per head, no sum of three.
      CHECK(testing::node_names(got) ==
            std::multiset<std::string>{"PackedAttentionBackward", "AccumulateGrad"});
    }
  }
  // Under autocast an f32 projection is rounded once; its gradient comes back in f32.
  const Tensor qkv = uniform({B, T, 3 * H * D}, -2, 2, &g);
  const Tensor packed = qkv.clone().requires_grad_(),
               rounded = qkv.to(DType::bf16).requires_grad_();
  Tensor got;
  {
    AutocastGuard autocast(DType::bf16);
    got = packed_self_attention(packed, H, true);
  }
  const auto [q, k, v] = split_packed_heads(rounded, H);
  const Tensor want = scaled_dot_product_attention(q, k, v, true);
  CHECK(got.dtype() == DType::bf16);
  CHECK(same_values(got, want));
  const Tensor grad = uniform({B, H, T, D}, -1, 1, &g).to(DType::bf16);
  got.backward(grad);
  want.backward(grad);
  CHECK(packed.grad().dtype() == DType::f32);
  CHECK(same_values(packed.grad(), rounded.grad().to(DType::f32)));
  CHECK_THROWS_WITH(packed_self_attention(zeros({2, 9, 35}), 3),
                    Catch::Contains("packed_self_attention: expects qkv [B, T, 3 * heads * D]"));
  CHECK_THROWS_WITH(packed_self_attention(zeros({2, 9, 0}), 3),
                    Catch::Contains("packed_self_attention: expects qkv [B, T, 3 * heads * D]"));
}

TEST_CASE("half attention is the f32 kernel on its widened heads rounded once", "[nn]") {
  // The backend's kernels on packed heads (row stride 3 H D), with more queries than one block
  // of the kernel (64); the gradients are written into packed heads too. bf16 heads compute so
  // where the CPU has no AVX512_BF16 dot product, and here with it turned off.
  set_cpu_bf16_dot(false);
  Generator g(47);
  const int64_t B = 2, T = 70, H = 3, D = 8, width = 3 * H * D;
  const double scale = 0.3;
  Backend& cpu = backend(Device::cpu());
  auto heads = [&](const Tensor& packed, int64_t which) {
    return Tensor::from_storage(packed.storage(), {B, H, T, D}, {T * width, D, width, 1},
                                which * H * D, packed.dtype());
  };
  for (DType half : {DType::bf16, DType::f16}) {
    for (bool causal : {true, false}) {
      INFO(half << (causal ? " causal" : " full"));
      const Tensor qkv = uniform({B, T, width}, -2, 2, &g).to(half), wide = qkv.to(DType::f32);
      const Tensor out = empty({B, H, T, D}, {half}), out_wide = empty({B, H, T, D});
      const Tensor lse = empty({B, H, T}), lse_wide = empty({B, H, T});
      cpu.attention(heads(qkv, 0), heads(qkv, 1), heads(qkv, 2), scale, causal, out, lse);
      cpu.attention(heads(wide, 0), heads(wide, 1), heads(wide, 2), scale, causal, out_wide,
                    lse_wide);
      CHECK(testing::bitwise_equal(out, out_wide.to(half)));
      CHECK(testing::bitwise_equal(lse, lse_wide));

      const Tensor grad_out = uniform({B, H, T, D}, -1, 1, &g).to(half);
      const Tensor grads = full({B, T, width}, 5.0, {half}), grads_wide = empty({B, T, width});
      cpu.attention_backward(grad_out, heads(qkv, 0), heads(qkv, 1), heads(qkv, 2), out, lse, scale,
                             causal, heads(grads, 0), heads(grads, 1), heads(grads, 2));
      cpu.attention_backward(grad_out.to(DType::f32), heads(wide, 0), heads(wide, 1),
                             heads(wide, 2), out.to(DType::f32), lse, scale, causal,
                             heads(grads_wide, 0), heads(grads_wide, 1), heads(grads_wide, 2));
      CHECK(testing::bitwise_equal(grads, grads_wide.to(half)));
    }
  }
  set_cpu_bf16_dot(true);
}

namespace {

// One head of attention in f64 from the kernel's own bf16 inputs (its bf16 out for the
// backward's row sums), and beside each result the sum of its terms' magnitudes: sum_j p |v_j|
// for out, sum_j |dS| |k_j| for dq, sum_i |dS| |q_i| for dk, sum_i p |dO_i| for dv.
struct HeadReference {
  std::vector<double> out, out_terms, gq, gq_terms, gk, gk_terms, gv, gv_terms;
};

HeadReference head_reference(const std::vector<double>& q, const std::vector<double>& k,
                             const std::vector<double>& v, const std::vector<double>& out,
                             const std::vector<double>& go, int64_t Tq, int64_t Tk, int64_t D,
                             double scale, bool causal) {
  HeadReference r;
  for (auto* x : {&r.out, &r.out_terms, &r.gq, &r.gq_terms}) x->assign(Tq * D, 0.0);
  for (auto* x : {&r.gk, &r.gk_terms, &r.gv, &r.gv_terms}) x->assign(Tk * D, 0.0);
  for (int64_t i = 0; i < Tq; ++i) {
    const int64_t visible = causal ? i + Tk - Tq + 1 : Tk;
    std::vector<double> p(visible), ds(visible);
    double mx = -INFINITY, sum = 0, row_dot = 0;
    for (int64_t j = 0; j < visible; ++j) {
      for (int64_t d = 0; d < D; ++d) p[j] += q[i * D + d] * k[j * D + d] * scale;
      mx = std::max(mx, p[j]);
    }
    for (double& x : p) sum += x = std::exp(x - mx);
    for (double& x : p) x /= sum;
    for (int64_t d = 0; d < D; ++d) row_dot += go[i * D + d] * out[i * D + d];
    for (int64_t j = 0; j < visible; ++j) {
      double dp = 0;
      for (int64_t d = 0; d < D; ++d) dp += go[i * D + d] * v[j * D + d];
      ds[j] = p[j] * (dp - row_dot) * scale;
      for (int64_t d = 0; d < D; ++d) {
        r.out[i * D + d] += p[j] * v[j * D + d];
        r.out_terms[i * D + d] += p[j] * std::abs(v[j * D + d]);
        r.gq[i * D + d] += ds[j] * k[j * D + d];
        r.gq_terms[i * D + d] += std::abs(ds[j] * k[j * D + d]);
        r.gk[j * D + d] += ds[j] * q[i * D + d];
        r.gk_terms[j * D + d] += std::abs(ds[j] * q[i * D + d]);
        r.gv[j * D + d] += p[j] * go[i * D + d];
        r.gv_terms[j * D + d] += p[j] * std::abs(go[i * D + d]);
      }
    }
  }
  return r;
}

// The largest of |got - want| / (u |want| + (u + 2^-16) terms) over one head's rows, u = 2^-8
// being bf16's unit roundoff: got is rounded once at the end (u |want|), and each term of its
// sum took one rounded bf16 factor, the weight or dS (u terms); 2^-16 covers f32 sums.
double worst_bound_ratio(const std::vector<double>& got, const std::vector<double>& want,
                         const std::vector<double>& terms, int64_t rows, int64_t D) {
  const double u = std::ldexp(1.0, -8);
  double worst = 0;
  for (int64_t i = 0; i < rows * D; ++i) {
    const double bound = u * std::abs(want[i]) + (u + std::ldexp(1.0, -16)) * terms[i];
    worst = std::max(worst, std::abs(got[i] - want[i]) / bound);
  }
  return worst;
}

}  // namespace

TEST_CASE("bf16 attention on the dot product is within bf16's rounding of f64 attention", "[nn]") {
  // Weights and dS are rounded to bf16 for the products that take them, as FlashAttention does
  // on half heads; every result is rounded once. Measured here: the worst error is 0.74 of the
  // bound below (out), 0.69 (dq), 0.76 (dk), 0.79 (dv). 70 queries over 75 keys: two query
  // blocks, the first seeing 69 keys when causal, an odd depth short of all keys; key 69's
  // value is infinite there, and no query that cannot see it may be touched by it. Results go
  // to interleaved heads, as they merge back.
  set_cpu_bf16_dot(true);
  if (!cpu_bf16_dot()) {
    WARN("this CPU has no AVX512_BF16: bf16 attention computes in f32 (the test above)");
    return;
  }
  Generator g(48);
  const int64_t B = 1, H = 2, Tq = 70, Tk = 75;
  const double scale = 0.3;
  Backend& cpu = backend(Device::cpu());
  for (int64_t D : {8, 40}) {
    for (bool causal : {true, false}) {
      INFO("D " << D << (causal ? " causal" : " full"));
      const Tensor q = uniform({B, H, Tq, D}, -2, 2, &g).to(DType::bf16),
                   k = uniform({B, H, Tk, D}, -2, 2, &g).to(DType::bf16),
                   v = uniform({B, H, Tk, D}, -2, 2, &g).to(DType::bf16),
                   go = uniform({B, H, Tq, D}, -1, 1, &g).to(DType::bf16);
      // Results in [B, T, H, D] memory, as the heads merge: a head's row is not all of a row.
      const auto merged = [&](int64_t T) {
        return permute(full({B, T, H, D}, 5.0, {DType::bf16}), {0, 2, 1, 3});
      };
      const Tensor out = merged(Tq), lse = empty({B, H, Tq});
      const Tensor gq = merged(Tq), gk = merged(Tk), gv = merged(Tk);
      cpu.attention(q, k, v, scale, causal, out, lse);
      cpu.attention_backward(go, q, k, v, out, lse, scale, causal, gq, gk, gv);
      const auto all = [](const Tensor& t) { return t.to_vector<double>(); };
      const std::vector<double> vq = all(q), vk = all(k), vv = all(v), vgo = all(go),
                                vout = all(out), vgq = all(gq), vgk = all(gk), vgv = all(gv);
      for (int64_t h = 0; h < B * H; ++h) {
        const auto rows = [&](const std::vector<double>& x, int64_t T) {
          return std::vector<double>(x.begin() + h * T * D, x.begin() + (h + 1) * T * D);
        };
        const HeadReference want =
            head_reference(rows(vq, Tq), rows(vk, Tk), rows(vv, Tk), rows(vout, Tq), rows(vgo, Tq),
                           Tq, Tk, D, scale, causal);
        CHECK(worst_bound_ratio(rows(vout, Tq), want.out, want.out_terms, Tq, D) <= 1.0);
        CHECK(worst_bound_ratio(rows(vgq, Tq), want.gq, want.gq_terms, Tq, D) <= 1.0);
        CHECK(worst_bound_ratio(rows(vgk, Tk), want.gk, want.gk_terms, Tk, D) <= 1.0);
        CHECK(worst_bound_ratio(rows(vgv, Tk), want.gv, want.gv_terms, Tk, D) <= 1.0);
      }
      if (!causal) continue;
      // Key 69 is past the first block's last visible key (63 + 75 - 70 = 68).
      std::vector<double> values = vv;
      for (int64_t h = 0; h < B * H; ++h) {
        std::fill_n(values.begin() + (h * Tk + 69) * D, D, INFINITY);
      }
      const Tensor v_inf = from_vector(values, {B, H, Tk, D}).to(DType::bf16);
      const Tensor out_inf = merged(Tq);
      cpu.attention(q, k, v_inf, scale, causal, out_inf, lse);
      CHECK(testing::bitwise_equal(narrow(out_inf, 2, 0, 64), narrow(out, 2, 0, 64)));
    }
  }
}

TEST_CASE("attention gives the same bits on 1 and 2 threads", "[nn]") {
  // Enough work that the kernels split the heads over two threads (tensor/parallel.h's grain),
  // and more queries than one block; bf16 runs on the dot product where the CPU has it.
  Generator g(43);
  const Shape shape{2, 4, 72, 8};
  for (DType dtype : {DType::f32, DType::bf16}) {
    INFO(dtype);
    const Tensor q = uniform(shape, -2, 2, &g).to(dtype), k = uniform(shape, -2, 2, &g).to(dtype),
                 v = uniform(shape, -2, 2, &g).to(dtype),
                 grad = uniform(shape, -1, 1, &g).to(dtype);
    auto run = [&](int threads) {
      const int before = get_num_threads();
      set_num_threads(threads);
      Tensor qq = q.clone().requires_grad_(), kk = k.clone().requires_grad_(),
             vv = v.clone().requires_grad_();
      Tensor out = scaled_dot_product_attention(qq, kk, vv, true);
      out.backward(grad);
      set_num_threads(before);
      return std::vector<Tensor>{out.detach(), qq.grad(), kk.grad(), vv.grad()};
    };
    const auto one = run(1), two = run(2);
    for (size_t i = 0; i < one.size(); ++i) CHECK(same_values(one[i], two[i]));
  }
}

TEST_CASE("attention under autocast rounds its inputs and returns the autocast dtype", "[nn]") {
  Generator g(44);
  const Tensor q = uniform({1, 2, 6, 8}, -2, 2, &g), k = uniform({1, 2, 6, 8}, -2, 2, &g),
               v = uniform({1, 2, 6, 8}, -2, 2, &g), grad = uniform({1, 2, 6, 8}, -1, 1, &g);
  for (DType half : {DType::bf16, DType::f16}) {
    INFO(half);
    const Tensor qq = q.clone().requires_grad_(), kk = k.clone().requires_grad_();
    const Tensor v_half = v.to(half).requires_grad_();  // a half activation goes in as it is
    Tensor got;
    {
      AutocastGuard autocast(half);
      got = scaled_dot_product_attention(qq, kk, v_half, true);
    }
    CHECK(got.dtype() == half);
    const Tensor q_half = q.to(half).requires_grad_(), k_half = k.to(half).requires_grad_(),
                 v_plain = v.to(half).requires_grad_();
    const Tensor want = scaled_dot_product_attention(q_half, k_half, v_plain, true);
    CHECK(same_values(got, want));
    // Rounded: not what f32 inputs give.
    CHECK_FALSE(same_values(got.to(DType::f32), scaled_dot_product_attention(q, k, v, true)));
    // Each gradient in its input's dtype: the half kernel's, widened for the f32 inputs.
    got.backward(grad.to(half));
    want.backward(grad.to(half));
    CHECK(qq.grad().dtype() == DType::f32);
    CHECK(same_values(qq.grad(), q_half.grad().to(DType::f32)));
    CHECK(same_values(kk.grad(), k_half.grad().to(DType::f32)));
    CHECK(v_half.grad().dtype() == half);
    CHECK(same_values(v_half.grad(), v_plain.grad()));
  }
}

TEST_CASE("attention refuses bad shapes and dtypes by name", "[nn]") {
  const Tensor x = zeros({1, 2, 4, 8});
  CHECK_THROWS_WITH(scaled_dot_product_attention(zeros({2, 4, 8}), x, x),
                    Catch::Contains("expects q [B, H, Tq, D]"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(x, zeros({1, 2, 4, 8}), zeros({1, 2, 5, 8})),
                    Catch::Contains("must both be [1, 2, 4, 8]"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(x, zeros({1, 2, 3, 8}), zeros({1, 2, 3, 8}), true),
                    Catch::Contains("causal attention needs no more queries than keys"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(x, x, x.to(DType::f64)),
                    Catch::Contains("need one floating dtype"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(x, zeros({1, 2, 0, 8}), zeros({1, 2, 0, 8})),
                    Catch::Contains("there are queries but no keys"));
}

TEST_CASE("CausalSelfAttention runs the packed fused kernel unless dropout needs the weights",
          "[nn]") {
  Generator g(45);
  const Tensor x = uniform({2, 10, 12}, -1, 1, &g);
  auto attention_nodes = [](const Tensor& out) {
    return testing::node_names(out).count("PackedAttentionBackward");
  };
  CausalSelfAttention plain(12, 3, 0.0, &g);
  const Tensor got = plain.forward(x);
  CHECK(attention_nodes(got) == 1);
  // The same weights, attention written out.
  const int64_t B = 2, T = 10, H = 3, D = 4;
  const Tensor heads = permute(reshape(plain.qkv->forward(x), {B, T, 3, H, D}), {2, 0, 3, 1, 4});
  const Tensor y =
      written_out(squeeze(narrow(heads, 0, 0, 1), 0), squeeze(narrow(heads, 0, 1, 1), 0),
                  squeeze(narrow(heads, 0, 2, 1), 0), true, 0.5);
  const Tensor want = plain.proj->forward(reshape(permute(y, {0, 2, 1, 3}), {B, T, 12}));
  CHECK(max_abs_difference(got, want) <= 1e-5);
  // Dropout on the weights in training keeps them in memory; in eval the fused kernel runs.
  CausalSelfAttention dropping(12, 3, 0.1, &g);
  CHECK(attention_nodes(dropping.forward(x)) == 0);
  dropping.eval();
  CHECK(attention_nodes(dropping.forward(x)) == 1);
}
