// Backend::matmul_bias, matmul_bias_grad, matmul_bias_gelu and matmul_dgelu, Linear's products
// with their bias (and an MLP's GELU and its derivative) fused (cuBLASLt's epilogues on CUDA),
// against a double-precision reference in every operand layout and dtype, into poisoned
// outputs, on the CPU and on CUDA; on CUDA a bias too misaligned for cuBLASLt takes the unfused
// ops to the same values. And linear_gelu and linear_gelu_linear, the autograd ops on top: the
// unfused ops' bits on the CPU, the latter in the GPT block.
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "autograd/node.h"
#include "autograd/split_backward.h"
#include "bitwise.h"
#include "cuda_testing.h"
#include "graph_names.h"
#include "nn/transformer.h"
#include "pipit.h"
#ifdef PIPIT_WITH_CUDA
#include "tensor/cuda/weight_gradient_split.h"
#endif

using namespace pipit;
using namespace testing::cuda_testing;
using testing::node_names;

namespace {

// The input and output dtypes a product may have: the backend's matmul rules.
struct Dtypes {
  DType in, out;
};
const Dtypes kBiasDtypes[] = {{DType::f32, DType::f32},
                              {DType::f64, DType::f64},
                              {DType::bf16, DType::bf16},
                              {DType::bf16, DType::f32},
                              {DType::f16, DType::f32}};

// [rows, cols] of values `dtype` holds exactly, row-major or (transposed) column-major.
Tensor operand(int64_t rows, int64_t cols, bool column_major, DType dtype, Generator& g) {
  return column_major ? transpose(uniform({cols, rows}, -2, 2, &g).to(dtype), 0, 1)
                      : uniform({rows, cols}, -2, 2, &g).to(dtype);
}

// The relative error a sum of K products may carry: the accumulator's rounding per term, the
// inputs' rounding to TF32 when `tf32`, and one rounding of the result to out's dtype.
double bound(DType in, DType out, int64_t K, bool tf32, double magnitude, double exact) {
  const double unit = in == DType::f64 ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24);
  const double result_step = out == DType::bf16  ? std::ldexp(1.0, -8)
                             : out == DType::f16 ? std::ldexp(1.0, -11)
                                                 : 0.0;
  const double inputs = tf32 ? std::ldexp(1.0, -10) : 0.0;
  return (2.0 * static_cast<double>(K + 1) * unit + inputs) * magnitude +
         result_step * std::abs(exact);
}

// GELU's tanh form in double, and its derivative.
double gelu_reference(double x) {
  return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
double gelu_derivative_reference(double x) {
  const double t = std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
}

// Runs the four ops on `device` with a [M, K] (column-major when a_t), b [K, N] (when b_t) and,
// with `misaligned`, a bias that starts one element into its storage; checks out, the product
// (a @ b), bias_grad (a summed over K), GELU's input and output, and the product times GELU's
// derivative at that input (matmul_dgelu) against the f64 reference.
void check_bias_products(Device device, Dtypes dt, int64_t M, int64_t N, int64_t K, bool a_t,
                         bool b_t, bool misaligned, bool tf32, Generator& g) {
  INFO(dt.in << " -> " << dt.out << ", " << M << " x " << N << " x " << K << (a_t ? ", a^T" : "")
             << (b_t ? ", b^T" : "") << (misaligned ? ", misaligned bias" : "")
             << (tf32 ? ", TF32" : "") << " on " << device.str());
  const Tensor a = operand(M, K, a_t, dt.in, g), b = operand(K, N, b_t, dt.in, g);
  const Tensor bias_storage = uniform({N + 1}, -2, 2, &g).to(dt.out);
  const Tensor bias = narrow(bias_storage, 0, misaligned ? 1 : 0, N);
  const Tensor a_on = a.to(device), b_on = b.to(device), bias_on = bias_storage.to(device);
  const Tensor bias_view = narrow(bias_on, 0, misaligned ? 1 : 0, N);
  Tensor out = poisoned({M, N}, dt.out, device), product = poisoned({M, N}, dt.out, device);
  Tensor bias_grad = poisoned({M}, dt.out, device);
  Tensor pre = poisoned({M, N}, dt.out, device), activated = poisoned({M, N}, dt.out, device);
  backend(device).matmul_bias(a_on, b_on, bias_view, out);
  backend(device).matmul_bias_grad(a_on, b_on, product, bias_grad);
  backend(device).matmul_bias_gelu(a_on, b_on, bias_view, pre, activated);
  Tensor dgelu = poisoned({M, N}, dt.out, device);
  backend(device).matmul_dgelu(a_on, b_on, pre, dgelu);

  const std::vector<double> av = a.contiguous().to_vector<double>();
  const std::vector<double> bv = b.contiguous().to_vector<double>();
  const std::vector<double> biasv = bias.to_vector<double>();
  const std::vector<double> got = out.to_vector<double>(),
                            got_product = product.to_vector<double>();
  const std::vector<double> got_sums = bias_grad.to_vector<double>();
  const std::vector<double> got_pre = pre.to_vector<double>(),
                            got_gelu = activated.to_vector<double>();
  const std::vector<double> got_dgelu = dgelu.to_vector<double>();
  int64_t bad = 0, bad_product = 0, bad_sums = 0, bad_gelu = 0, bad_dgelu = 0;
  for (int64_t i = 0; i < M; ++i) {
    double sum = 0, sum_magnitude = 0;
    for (int64_t k = 0; k < K; ++k) {
      sum += av[i * K + k];
      sum_magnitude += std::abs(av[i * K + k]);
    }
    if (!(std::abs(got_sums[i] - sum) <= bound(dt.in, dt.out, K, tf32, sum_magnitude, sum))) {
      ++bad_sums;
    }
    for (int64_t j = 0; j < N; ++j) {
      double exact = 0, magnitude = 0;
      for (int64_t k = 0; k < K; ++k) {
        exact += av[i * K + k] * bv[k * N + j];
        magnitude += std::abs(av[i * K + k] * bv[k * N + j]);
      }
      const size_t at = static_cast<size_t>(i * N + j);
      if (!(std::abs(got_product[at] - exact) <= bound(dt.in, dt.out, K, tf32, magnitude, exact))) {
        ++bad_product;
      }
      const double with_bias = exact + biasv[j];
      const double with_magnitude = magnitude + std::abs(biasv[j]);
      const double pre_bound = bound(dt.in, dt.out, K, tf32, with_magnitude, with_bias);
      if (!(std::abs(got[at] - with_bias) <= pre_bound)) ++bad;
      if (!(std::abs(got_pre[at] - with_bias) <= pre_bound)) ++bad_gelu;
      // GELU's slope is below 1.13: the sum's error carries over at most 1.2 times, plus the
      // result's rounding and the exp's.
      const double want_gelu = gelu_reference(with_bias);
      const double gelu_bound = 1.2 * pre_bound + bound(dt.in, dt.out, 0, false, 0.0, want_gelu) +
                                (dt.in == DType::f64 ? 1e-14 : 1e-6) * (std::abs(with_bias) + 1);
      if (!(std::abs(got_gelu[at] - want_gelu) <= gelu_bound)) ++bad_gelu;
      // The derivative at pre as stored is below 1.13 in magnitude, so likewise; the CPU rounds
      // the product before scaling it, CUDA's epilogue after.
      const double want_dgelu = exact * gelu_derivative_reference(got_pre[at]);
      const double dgelu_bound = 1.2 * bound(dt.in, dt.out, K, tf32, magnitude, exact) +
                                 bound(dt.in, dt.out, 0, false, 0.0, want_dgelu) +
                                 (dt.in == DType::f64 ? 1e-14 : 1e-6) * std::abs(exact);
      if (!(std::abs(got_dgelu[at] - want_dgelu) <= dgelu_bound)) ++bad_dgelu;
    }
  }
  CHECK(bad == 0);
  CHECK(bad_product == 0);
  CHECK(bad_sums == 0);
  CHECK(bad_gelu == 0);
  CHECK(bad_dgelu == 0);
}

// Every dtype pair, layout and shape on `device`.
void check_all_bias_products(Device device, bool misaligned, bool tf32) {
  Generator g(71);
  const std::vector<std::array<int64_t, 3>> shapes = {
      {1, 1, 1}, {3, 5, 7}, {37, 53, 29}, {64, 48, 128}, {8, 256, 512}};
  for (const Dtypes& dt : kBiasDtypes) {
    if (tf32 && dt.in != DType::f32) continue;
    for (const auto& [M, N, K] : shapes) {
      for (int layout = 0; layout < 4; ++layout) {
        check_bias_products(device, dt, M, N, K, layout & 1, layout & 2, misaligned, tf32, g);
      }
    }
  }
}

}  // namespace

TEST_CASE("matmul_bias and matmul_bias_grad match a double-precision reference", "[tensor]") {
  check_all_bias_products(kCpu, false, false);
  check_all_bias_products(kCpu, true, false);
}

TEST_CASE("matmul_bias and matmul_bias_grad refuse mismatched operands by name", "[tensor]") {
  Backend& cpu = backend(kCpu);
  const Tensor a = zeros({4, 3}), b = zeros({3, 5});
  CHECK_THROWS_WITH(cpu.matmul_bias(a, zeros({2, 5}), zeros({5}), zeros({4, 5})),
                    Catch::Contains("matmul_bias: expects a [M, K], b [K, N] and out [M, N]"));
  CHECK_THROWS_WITH(cpu.matmul_bias(a, b, zeros({4}), zeros({4, 5})),
                    Catch::Contains("matmul_bias: the vector must be [5] in F32, got [4] in F32"));
  CHECK_THROWS_WITH(cpu.matmul_bias(a, b, zeros({5}, {DType::f64}), zeros({4, 5})),
                    Catch::Contains("the vector must be [5] in F32, got [5] in F64"));
  CHECK_THROWS_WITH(cpu.matmul_bias(a, b, zeros({5}), zeros({4, 5}, {DType::bf16})),
                    Catch::Contains("do not go together"));
  CHECK_THROWS_WITH(cpu.matmul_bias_grad(a, b, zeros({4, 5}), zeros({5})),
                    Catch::Contains("matmul_bias_grad: the vector must be [4]"));
  CHECK_THROWS_WITH(cpu.matmul_bias_grad(a, b, transpose(zeros({5, 4}), 0, 1), zeros({4})),
                    Catch::Contains("must be contiguous"));
  CHECK_THROWS_WITH(cpu.matmul_dgelu(a, b, zeros({4, 5}, {DType::f64}), zeros({4, 5})),
                    Catch::Contains("matmul_dgelu: pre must be contiguous with out's shape [4, 5] "
                                    "and dtype F32, got [4, 5] in F64"));
}

TEST_CASE("cuda: matmul_bias and matmul_bias_grad match the reference, fused and unfused",
          "[cuda]") {
  if (!cuda_ready()) return;
  check_all_bias_products(kCuda, false, false);
  // A bias 4 or 2 bytes past an aligned address: cuBLASLt is not asked, the unfused ops run.
  check_all_bias_products(kCuda, true, false);
  set_float32_matmul_precision("high");
  check_all_bias_products(kCuda, false, true);
  set_float32_matmul_precision("highest");
}

#ifdef PIPIT_WITH_CUDA
TEST_CASE("cuda: a small weight gradient split over runs of rows adds its runs in order",
          "[cuda]") {
  if (!cuda_ready()) return;
  Generator g(12);
  // grad_out [rows, M] and input [rows, N] in bf16, as autocast hands them to a Linear's
  // weight gradient: a = grad_out^T [M, rows].
  const auto weight_grad = [&](const Tensor& grad_out, const Tensor& input, int parts) {
    cuda::set_weight_gradient_parts(parts);
    const int64_t M = grad_out.shape()[1], N = input.shape()[1];
    Tensor out = poisoned({M, N}, DType::f32, kCuda), bias = poisoned({M}, DType::f32, kCuda);
    backend(kCuda).matmul_bias_grad(transpose(grad_out, 0, 1), input, out, bias);
    cuda::set_weight_gradient_parts(1);
    return std::pair{out.to(kCpu), bias.to(kCpu)};
  };
  // 256 x 128: 2 tiles, split; 2048 x 2048: 256 tiles, whole whatever the setting; 2050 rows
  // split into 2 runs of 1025 but not into 4 (not divisible); 3072 rows not into 4 runs of
  // 768 (under 1024 rows each).
  bool a_split_changed_bits = false;
  for (const auto& [rows, M, N] : std::vector<std::array<int64_t, 3>>{
           {4096, 256, 128}, {2048, 2048, 2048}, {2050, 256, 128}, {3072, 256, 128}}) {
    INFO(rows << " rows, " << M << " x " << N);
    const Tensor grad_out = randn({rows, M}, &g).to(DType::bf16).to(kCuda);
    const Tensor input = randn({rows, N}, &g).to(DType::bf16).to(kCuda);
    const auto whole = weight_grad(grad_out, input, 1);
    // The f64 reference of the same bf16 operands.
    const Tensor go = grad_out.to(kCpu).to(DType::f64), in = input.to(kCpu).to(DType::f64);
    const Tensor want = matmul(transpose(go, 0, 1), in);
    const Tensor want_bias = sum(go, {0});
    const double scale = max(abs(want)).item<double>();
    for (const int parts : {2, 4}) {
      INFO(parts << " parts");
      const cuda::WeightGradientSplits before = cuda::weight_gradient_splits();
      const auto split = weight_grad(grad_out, input, parts);
      const auto again = weight_grad(grad_out, input, parts);
      const cuda::WeightGradientSplits after = cuda::weight_gradient_splits();
      const bool splits = M * N < 132 * 128 * 128 && rows % parts == 0 && rows / parts >= 1024;
      // Refused, cuBLASLt had no algorithm for the batched product with BGRADB: not a wrong
      // result, a split that never ran.
      CHECK(after.refused == before.refused);
      CHECK(after.taken - before.taken == (splits ? 2 : 0));
      CHECK(testing::bitwise_equal(split.first, again.first));  // the same order every run
      CHECK(testing::bitwise_equal(split.second, again.second));
      CHECK(testing::max_abs_difference(split.first.to(DType::f64), want) <= 1e-5 * scale);
      CHECK(testing::max_abs_difference(split.second.to(DType::f64), want_bias) <= 1e-5 * rows);
      // Not split, the same call as the whole product's. Split, the f32 sums come in another
      // order, unless cuBLASLt splits the whole product the same way itself: on an H200
      // (2026-11-28) 3072 rows in 2 runs gave the whole product's bits, 4096 rows did not.
      if (splits) {
        a_split_changed_bits |= !testing::bitwise_equal(split.first, whole.first);
      } else {
        CHECK(testing::bitwise_equal(split.first, whole.first));
      }
    }
  }
  CHECK(a_split_changed_bits);
  CHECK_THROWS_WITH(cuda::set_weight_gradient_parts(3), Catch::Contains("1, 2 or 4, got 3"));
}
#endif

TEST_CASE("linear_gelu and linear_gelu_linear give the unfused ops' bits and gradients", "[nn]") {
  Generator g(72);
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    INFO(dtype);
    // bf16: f32 tensors under bf16 autocast, as training runs it.
    const DType stored = dtype == DType::bf16 ? DType::f32 : dtype;
    const std::vector<Tensor> inputs = {
        uniform({2, 5, 12}, -2, 2, &g).to(stored), uniform({16, 12}, -0.5, 0.5, &g).to(stored),
        uniform({16}, -0.5, 0.5, &g).to(stored), uniform({12, 16}, -0.5, 0.5, &g).to(stored),
        uniform({12}, -0.5, 0.5, &g).to(stored)};
    const Tensor grad_hidden = uniform({2, 5, 16}, -1, 1, &g).to(dtype);
    const Tensor grad_out = uniform({2, 5, 12}, -1, 1, &g).to(dtype);
    // 0: gelu(linear), 1: linear_gelu, 2: linear(gelu(linear)), 3: linear_gelu_linear,
    // 4: linear_gelu_linear through a split backward (x's gradient first, the weights' later).
    auto run = [&](int variant) {
      std::vector<Tensor> leaves;
      for (const Tensor& t : inputs) leaves.push_back(t.clone().requires_grad_());
      const Tensor &x = leaves[0], &w1 = leaves[1], &b1 = leaves[2], &w2 = leaves[3],
                   &b2 = leaves[4];
      Tensor out;
      {
        AutocastGuard autocast(dtype == DType::bf16 ? DType::bf16 : DType::f32);
        switch (variant) {
          case 0:
            out = gelu(linear(x, w1, b1));
            break;
          case 1:
            out = linear_gelu(x, w1, b1);
            break;
          case 2:
            out = linear(gelu(linear(x, w1, b1)), w2, b2);
            break;
          default:
            out = linear_gelu_linear(x, w1, b1, w2, b2);
        }
      }
      const char* node = variant == 1 ? "LinearGeluBackward" : "GeluMlpBackward";
      if (variant % 2 == 1 || variant == 4) CHECK(out.grad_fn()->name() == node);
      const Tensor& grad = variant < 2 ? grad_hidden : grad_out;
      if (variant == 4) {
        DeferredGradients later = backward_inputs_first(out, grad, {x});
        CHECK(x.grad().defined());
        CHECK(!w1.grad().defined());
        later.run();
      } else {
        out.backward(grad);
      }
      std::vector<Tensor> results{out.detach()};
      for (const Tensor& leaf : leaves) {
        if (leaf.grad().defined()) results.push_back(leaf.grad());
      }
      return results;
    };
    for (const auto& [fused, plain] : std::vector<std::pair<int, int>>{{1, 0}, {3, 2}, {4, 2}}) {
      INFO("variant " << fused << " against " << plain);
      const auto got = run(fused), want = run(plain);
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        INFO("result " << i);
        CHECK(got[i].dtype() == want[i].dtype());
        CHECK(got[i].to_vector<double>() == want[i].to_vector<double>());
      }
    }
  }
  CHECK_THROWS_WITH(linear_gelu(zeros({2, 3}), zeros({4, 3}), Tensor()),
                    Catch::Contains("linear_gelu: needs a bias"));
  CHECK_THROWS_WITH(
      linear_gelu_linear(zeros({2, 3}), zeros({4, 3}), zeros({4}), zeros({3, 4}), Tensor()),
      Catch::Contains("linear_gelu_linear: needs both biases"));
  // The block's MLP is one node (a block built without it would have Linear and GELU nodes).
  TransformerBlock block(12, 3, 0.0, &g);
  const std::multiset<std::string> names =
      node_names(block.forward(uniform({1, 4, 12}, -1, 1, &g)));
  CHECK(names.count("GeluMlpBackward") == 1);
  CHECK(names.count("LinearGeluBackward") == 0);
  CHECK(names.count("GeluBackward") == 0);
  CHECK(names.count("LinearBackward") == 2);  // the attention's two products
}
