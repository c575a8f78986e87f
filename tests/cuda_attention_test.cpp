// The CUDA attention kernels against the CPU's: the tensor-core kernels (bf16/f16, head dims
// 32/64/128) and the CUDA-core ones (every other case), forward and backward, into poisoned
// outputs, at sizes that are not multiples of any tile; strided operands; repeatability.
// Without a CUDA device each case reports "skipped" and passes.
#include <catch2/catch.hpp>
#include <cmath>
#include <sstream>

#include "cuda_testing.h"
#include "pipit.h"
#include "tensor/kernel_layout.h"
#ifdef PIPIT_WITH_CUDA
#include "tensor/cuda/attention_provider.h"
#endif

using namespace pipit;
using namespace testing::cuda_testing;

// Without CUDA every case skips before it needs these.
#ifdef PIPIT_WITH_CUDA
namespace {

struct Case {
  int64_t batch, heads, queries, keys, head_dim;
  bool causal;
};

// The outputs of Backend::attention and attention_backward on `device`: out, lse, dq, dk, dv.
std::vector<Tensor> run(Device device, const Case& c, const std::vector<Tensor>& inputs,
                        double scale) {
  std::vector<Tensor> in;
  for (const Tensor& t : inputs) in.push_back(t.to(device));
  const Tensor &q = in[0], &k = in[1], &v = in[2], &grad = in[3];
  const DType dt = q.dtype();
  Tensor out = poisoned(q.shape(), dt, device);
  Tensor lse = poisoned({c.batch, c.heads, c.queries}, accumulate_dtype(dt), device);
  backend(device).attention(q, k, v, scale, c.causal, out, lse);
  Tensor dq = poisoned(q.shape(), dt, device), dk = poisoned(k.shape(), dt, device),
         dv = poisoned(v.shape(), dt, device);
  backend(device).attention_backward(grad, q, k, v, out, lse, scale, c.causal, dq, dk, dv);
  return {out, lse, dq, dk, dv};
}

// |got - want| <= tol * max(|want|, mean |want|, floor) everywhere, NaN (poison) nowhere.
void check_close(const Tensor& got, const Tensor& want, double tol, const char* what,
                 double floor = 0) {
  INFO(what);
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  REQUIRE(g.size() == w.size());
  double mean = 0;
  for (double x : w) mean += std::abs(x);
  mean = w.empty() ? 0 : mean / static_cast<double>(w.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const bool ok = std::abs(g[i] - w[i]) <= tol * std::max({std::abs(w[i]), mean, floor});
    if (!ok && bad++ == 0) first = i;
  }
  INFO("first of " << bad << " mismatches at " << first << ": got " << (g.empty() ? 0 : g[first])
                   << ", want " << (w.empty() ? 0 : w[first]));
  CHECK(bad == 0);
}

// bf16 keeps 8 bits and the kernels round the weights to it before multiplying by v (or by the
// output's gradient): where such a sum cancels, an H200 was 5.8% off one element of v's gradient
// (0.0713 for 0.0757, 130 tokens) and cuDNN 4.2% off one of qkv's.
double tolerance(DType dt) {
  switch (dt) {
    case DType::f64:
      return 1e-10;
    case DType::f32:
      return 1e-4;
    case DType::f16:
      return 1e-2;
    default:
      return 8e-2;
  }
}

using cuda::AttentionProvider;

// The providers this build has, each set for the scope of one loop turn.
std::vector<AttentionProvider> attention_providers() {
  std::vector<AttentionProvider> all = {AttentionProvider::pipit};
  if (cuda::cudnn_attention_built()) all.push_back(AttentionProvider::cudnn);
  return all;
}

struct ProviderScope {
  explicit ProviderScope(AttentionProvider p) { cuda::set_attention_provider(p); }
  ~ProviderScope() { cuda::set_attention_provider(AttentionProvider::automatic); }
};

const char* name(AttentionProvider p) {
  return p == AttentionProvider::cudnn ? "cuDNN" : "pipit's kernels";
}

// What cuDNN's fused attention takes (attention_provider.h).
bool cudnn_takes(const Case& c, DType dt) {
  return (dt == DType::bf16 || dt == DType::f16) && c.queries == c.keys && c.queries > 1 &&
         c.head_dim % 8 == 0 && c.head_dim <= 128;
}

std::vector<Tensor> random_inputs(const Case& c, DType dt, Generator& g) {
  const Shape qs{c.batch, c.heads, c.queries, c.head_dim}, ks{c.batch, c.heads, c.keys, c.head_dim};
  return {uniform(qs, -2, 2, &g).to(dt), uniform(ks, -2, 2, &g).to(dt),
          uniform(ks, -2, 2, &g).to(dt), uniform(qs, -1, 1, &g).to(dt)};
}

// Runs body(provider, dtype) for each provider this build has, set for the call, in bf16 and
// f32 (cuDNN takes half only).
template <typename Body>
void each_provider_and_dtype(Body body) {
  for (AttentionProvider provider : attention_providers()) {
    ProviderScope scope(provider);
    for (DType dt : {DType::bf16, DType::f32}) {
      if (provider == AttentionProvider::cudnn && dt == DType::f32) continue;
      INFO(name(provider) << ", " << dt);
      body(provider, dt);
    }
  }
}

// The same result through views and through dense tensors: pipit's kernels give the same bits;
// cuDNN may plan another kernel for another layout, so there the two only agree closely.
void check_layout_free(AttentionProvider provider, DType dt, const Tensor& views,
                       const Tensor& dense, const char* what) {
  if (provider == AttentionProvider::pipit) {
    CHECK(views.to_vector<double>() == dense.to_vector<double>());
  } else {
    check_close(views, dense, tolerance(dt), what);
  }
}

}  // namespace
#endif

TEST_CASE("cuda: attention and its backward match the CPU", "[cuda]") {
  if (!cuda_ready()) return;
#ifdef PIPIT_WITH_CUDA
  Generator g(51);
  const std::vector<Case> cases = {
      {1, 1, 1, 1, 64, true},      // batch 1, one token
      {2, 3, 17, 17, 64, true},    // less than a tile
      {1, 2, 130, 130, 64, true},  // tiles and a remainder
      {2, 2, 77, 77, 32, true},   {1, 2, 70, 70, 128, true}, {2, 1, 45, 45, 64, false},
      {1, 2, 5, 90, 64, true},   // fewer queries than keys (a cache's step)
      {1, 3, 40, 40, 40, true},  // a head dim the tensor cores do not take
  };
  for (AttentionProvider provider : attention_providers()) {
    ProviderScope scope(provider);
    INFO(name(provider));
    for (DType dt : {DType::bf16, DType::f16, DType::f32, DType::f64}) {
      for (const Case& c : cases) {
        if (provider == AttentionProvider::cudnn && !cudnn_takes(c, dt)) continue;
        INFO(dt << ": B " << c.batch << " H " << c.heads << " Tq " << c.queries << " Tk " << c.keys
                << " D " << c.head_dim << (c.causal ? " causal" : " full"));
        const std::vector<Tensor> inputs = random_inputs(c, dt, g);
        const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
        const std::vector<Tensor> want = run(kCpu, c, inputs, scale);
        const std::vector<Tensor> got = run(kCuda, c, inputs, scale);
        const char* names[] = {"out", "lse", "grad q", "grad k", "grad v"};
        // With one key q's and k's gradients are 0 on the CPU; the GPU forms the two sums that
        // cancel there in another order, leaving their accumulator's rounding: an H200 left
        // 1.8e-7 in bf16 and 2e-16 in f64. That is allowed (scaled by tol), not more.
        const double unit = std::ldexp(1.0, dt == DType::f64 ? -52 : -23);
        const double floor = 2.0 * static_cast<double>(c.head_dim) * unit / tolerance(dt);
        for (size_t i = 0; i < got.size(); ++i) {
          check_close(got[i], want[i], tolerance(dt), names[i], floor);
        }
      }
    }
  }
  // Forced onto cuDNN, a call it cannot take is refused by name.
  if (cuda::cudnn_attention_built()) {
    ProviderScope scope(AttentionProvider::cudnn);
    const Case c{1, 1, 4, 9, 64, true};
    CHECK_THROWS_WITH(
        run(kCuda, c, random_inputs(c, DType::bf16, g), 0.125),
        Catch::Contains("cuDNN's fused attention") && Catch::Contains("4 queries, 9 keys"));
  }
#endif
}

TEST_CASE("cuda: attention reads strided views and repeats its bits", "[cuda]") {
  if (!cuda_ready()) return;
#ifdef PIPIT_WITH_CUDA
  Generator g(52);
  const int64_t B = 2, T = 100, H = 3, D = 64;
  each_provider_and_dtype([&](AttentionProvider provider, DType dt) {
    // [B, T, 3, H, D] -> q, k, v [B, H, T, D] views, as CausalSelfAttention makes them.
    const Tensor packed = uniform({B, T, 3, H, D}, -2, 2, &g).to(dt).to(kCuda);
    const Tensor heads = permute(packed, {2, 0, 3, 1, 4});
    const Tensor q = squeeze(narrow(heads, 0, 0, 1), 0), k = squeeze(narrow(heads, 0, 1, 1), 0),
                 v = squeeze(narrow(heads, 0, 2, 1), 0);
    const Tensor grad = uniform({B, H, T, D}, -1, 1, &g).to(dt).to(kCuda);
    const Case c{B, H, T, T, D, true};
    auto strided = run(kCuda, c, {q, k, v, grad}, 0.125);
    auto dense = run(kCuda, c, {q.contiguous(), k.contiguous(), v.contiguous(), grad}, 0.125);
    auto again = run(kCuda, c, {q, k, v, grad}, 0.125);
    for (size_t i = 0; i < strided.size(); ++i) {
      INFO("output " << i);
      // Every run repeats its bits (cuDNN's backward in its deterministic mode).
      CHECK(strided[i].to_vector<double>() == again[i].to_vector<double>());
      check_layout_free(provider, dt, strided[i], dense[i], "strided vs dense");
    }
  });
#endif
}

TEST_CASE("cuda: packed self-attention writes its gradients into the packed layout", "[cuda]") {
  if (!cuda_ready()) return;
#ifdef PIPIT_WITH_CUDA
  Generator g(53);
  const int64_t B = 2, T = 100, H = 3, D = 64;
  each_provider_and_dtype([&](AttentionProvider provider, DType dt) {
    const Tensor qkv = uniform({B, T, 3 * H * D}, -2, 2, &g).to(dt);
    const Tensor grad = uniform({B, H, T, D}, -1, 1, &g).to(dt);
    // out and qkv's gradient: packed on `device`, or through split_packed_heads' views.
    auto run_packed = [&](Device device, bool split) {
      Tensor leaf = qkv.to(device).clone().requires_grad_();
      Tensor out;
      if (split) {
        const auto [q, k, v] = split_packed_heads(leaf, H);
        out = scaled_dot_product_attention(q, k, v, true);
      } else {
        out = packed_self_attention(leaf, H, true);
      }
      out.backward(grad.to(device));
      return std::vector<Tensor>{out.detach(), leaf.grad()};
    };
    const auto packed = run_packed(kCuda, false), split = run_packed(kCuda, true),
               cpu = run_packed(kCpu, false);
    for (size_t i = 0; i < packed.size(); ++i) {
      INFO((i == 0 ? "output" : "qkv's gradient"));
      check_layout_free(provider, dt, packed[i], split[i], "packed vs split");
      check_close(packed[i], cpu[i], tolerance(dt), "CUDA vs CPU");
    }
  });
#endif
}

// Inputs whose right answer can be read off a printout, for a first diagnosis on a GPU: with
// q = 0 every visible key weighs the same, so output row i is the mean of v's rows 0..i, and
// v's row j is (j, j, ...): row i of the output is i / 2 everywhere.
TEST_CASE("cuda: attention with equal weights averages the visible rows of v", "[cuda]") {
  if (!cuda_ready()) return;
  for (DType dt : {DType::bf16, DType::f32}) {
    for (int64_t D : {32, 64, 128}) {
      const int64_t T = 20;
      INFO(dt << ", D " << D);
      const Tensor q = zeros({1, 1, T, D}, {dt, kCuda});
      const Tensor k = uniform({1, 1, T, D}, -1, 1).to(dt).to(kCuda);
      const Tensor rows = reshape(arange(0, static_cast<double>(T), 1, {DType::f32}), {1, 1, T, 1});
      const Tensor v = (rows * ones({1, 1, T, D})).to(dt).to(kCuda);
      Tensor out = poisoned({1, 1, T, D}, dt, kCuda);
      Tensor lse = poisoned({1, 1, T}, DType::f32, kCuda);
      backend(kCuda).attention(q, k, v, 0.125, true, out, lse);
      const std::vector<double> got = out.to(kCpu).to_vector<double>();
      const std::vector<double> got_lse = lse.to(kCpu).to_vector<double>();
      std::ostringstream table;
      for (int64_t i = 0; i < T; ++i) {
        table << "row " << i << ": out[0] " << got[static_cast<size_t>(i * D)] << " out[D-1] "
              << got[static_cast<size_t>(i * D + D - 1)] << " lse "
              << got_lse[static_cast<size_t>(i)] << " (want " << i / 2.0 << ", lse "
              << std::log(i + 1.0) << ")\n";
      }
      INFO(table.str());
      for (int64_t i = 0; i < T; ++i) {
        CHECK(std::abs(got_lse[static_cast<size_t>(i)] - std::log(i + 1.0)) < 1e-4);
        for (int64_t d = 0; d < D; ++d) {
          CHECK(std::abs(got[static_cast<size_t>(i * D + d)] - i / 2.0) < 0.02 * (1 + i));
        }
      }
    }
  }
}
