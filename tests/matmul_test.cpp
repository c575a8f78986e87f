// The CPU GEMM, with every provider this build has (OpenBLAS, and oneDNN where built in),
// against a double-precision reference: every operand layout (row- and column-major, strided,
// batched, broadcast), accumulation into the output as Linear's bias does it, and shapes
// large enough to be split into tiles. The bound is the classic one for a K-term dot product
// in float, K * 2^-24 * sum |a_ik * b_kj| (with a factor 2 to spare), so a provider that
// loses precision, reads a wrong stride or drops a tile fails.
#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "bitwise.h"
#include "pipit.h"
#include "tensor/cpu/cpu_backend.h"

using namespace pipit;
using testing::bitwise_equal;

namespace {

// a [batch or 1, M, K] and b [batch or 1, K, N], any strides; out [batch, M, N].
void check_against_reference(const Tensor& a, const Tensor& b, const Tensor& out,
                             const std::vector<float>& addend = {}) {
  const std::vector<float> av = a.contiguous().to_vector<float>();
  const std::vector<float> bv = b.contiguous().to_vector<float>();
  const std::vector<float> ov = out.to_vector<float>();
  const int64_t M = a.shape()[a.dim() - 2], K = a.shape()[a.dim() - 1];
  const int64_t N = b.shape()[b.dim() - 1];
  const int64_t a_batch = a.dim() == 3 ? a.shape()[0] : 1,
                b_batch = b.dim() == 3 ? b.shape()[0] : 1;
  const int64_t batch = std::max(a_batch, b_batch);
  REQUIRE(static_cast<int64_t>(ov.size()) == batch * M * N);
  int64_t bad = 0;
  for (int64_t p = 0; p < batch; ++p) {
    const float* pa = av.data() + (a_batch == 1 ? 0 : p) * M * K;
    const float* pb = bv.data() + (b_batch == 1 ? 0 : p) * K * N;
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = 0; j < N; ++j) {
        double exact = addend.empty() ? 0.0 : addend[j];
        double magnitude = std::abs(exact);
        for (int64_t k = 0; k < K; ++k) {
          exact += static_cast<double>(pa[i * K + k]) * pb[k * N + j];
          magnitude += std::abs(static_cast<double>(pa[i * K + k]) * pb[k * N + j]);
        }
        const double bound = 2.0 * static_cast<double>(K + 1) * std::ldexp(1.0, -24) * magnitude;
        if (!(std::abs(ov[(p * M + i) * N + j] - exact) <= bound)) ++bad;
      }
    }
  }
  INFO("provider " << cpu_gemm_provider() << ", " << M << " x " << N << " x " << K << " batch "
                   << batch);
  CHECK(bad == 0);
}

// The providers this build has, and the automatic choice (the one the rest of the suite runs
// with), which mixes them by product size on CPUs without AVX-512.
std::vector<GemmProvider> gemm_providers() {
  std::vector<GemmProvider> list{GemmProvider::openblas, GemmProvider::automatic};
  try {
    set_cpu_gemm_provider(GemmProvider::onednn);
    list.push_back(GemmProvider::onednn);
  } catch (const Error&) {
    WARN("this build has no oneDNN: OpenBLAS only");
  }
  set_cpu_gemm_provider(GemmProvider::automatic);
  return list;
}

// Runs `body` once with each provider, then goes back to the automatic choice.
template <typename Body>
void with_each_provider(Body body) {
  for (GemmProvider provider : gemm_providers()) {
    set_cpu_gemm_provider(provider);
    try {
      body();
    } catch (...) {
      set_cpu_gemm_provider(GemmProvider::automatic);
      throw;
    }
  }
  set_cpu_gemm_provider(GemmProvider::automatic);
}

// [rows, cols] values, stored row-major or (transposed) column-major.
Tensor matrix(int64_t rows, int64_t cols, bool column_major, Generator& generator) {
  return column_major ? transpose(randn({cols, rows}, &generator), 0, 1)
                      : randn({rows, cols}, &generator);
}

}  // namespace

TEST_CASE("matmul matches a double-precision reference in every operand layout", "[tensor]") {
  Generator generator(11);
  const std::vector<std::array<int64_t, 3>> shapes = {
      {1, 1, 1},      {3, 5, 7},       {17, 33, 65},   {64, 64, 64},
      {129, 257, 95}, {256, 10, 1024}, {300, 333, 200}};  // the last is over the size at which a
                                                          // product is split into tiles
  with_each_provider([&] {
    for (const auto& [M, N, K] : shapes) {
      for (int layout = 0; layout < 4; ++layout) {
        const Tensor a = matrix(M, K, layout & 1, generator);
        const Tensor b = matrix(K, N, layout & 2, generator);
        check_against_reference(a, b, matmul(a, b));
      }
    }
  });
}

TEST_CASE("matmul: strided, batched and broadcast operands, and accumulation", "[tensor]") {
  Generator generator(12);
  with_each_provider([&] {
    // A row stride larger than the row: every other row of a taller matrix.
    const Tensor tall = randn({2 * 37, 41}, &generator);
    const Tensor strided = slice(tall, 0, 0, 2 * 37, 2);
    const Tensor b = randn({41, 29}, &generator);
    check_against_reference(strided, b, matmul(strided, b));

    // A batch against a shared matrix (folded into one product) and against its own matrices.
    const Tensor batch = randn({3, 70, 50}, &generator);
    const Tensor shared = randn({50, 90}, &generator);
    check_against_reference(batch, unsqueeze(shared, 0), matmul(batch, shared));
    const Tensor own = transpose(randn({3, 90, 50}, &generator), 1, 2);
    check_against_reference(batch, own, matmul(batch, own));

    // Linear preloads the bias into the output and accumulates the product onto it.
    const Tensor x = randn({300, 200}, &generator), weight = randn({333, 200}, &generator);
    const Tensor bias = randn({333}, &generator);
    check_against_reference(x, transpose(weight, 0, 1), linear(x, weight, bias),
                            bias.to_vector<float>());
  });
}

TEST_CASE("matmul results are the same bits run to run and at any thread count", "[tensor]") {
  Generator generator(13);
  const Tensor a = randn({256, 784}, &generator), w = randn({1024, 784}, &generator);
  const Tensor heads = randn({4, 128, 32}, &generator);
  auto products = [&] {
    return std::vector<std::vector<float>>{
        matmul(a, transpose(w, 0, 1)).to_vector<float>(),
        matmul(transpose(a, 0, 1), matmul(a, transpose(w, 0, 1))).to_vector<float>(),
        matmul(heads, transpose(heads, 1, 2)).to_vector<float>()};
  };
  const int threads = get_num_threads();
  with_each_provider([&] {
    set_num_threads(1);
    const std::vector<std::vector<float>> first = products();
    CHECK(products() == first);
    set_num_threads(4);
    CHECK(products() == first);
    set_num_threads(threads);
  });
}

namespace {

// sum_k x[k] w[k] in lane_sum's order (tensor/cpu/vec_math.h): eight interleaved partial
// sums, added in a fixed tree.
float lane_dot(const float* x, const float* w, int64_t K) {
  float acc[8] = {};
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += x[k + j] * w[k + j];
  }
  for (int j = 0; k + j < K; ++j) acc[j] += x[k + j] * w[k + j];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

}  // namespace

TEST_CASE(
    "products of few rows by a weight, f32 or bf16, are summed in one fixed order at any "
    "thread count",
    "[tensor]") {
  // Generation's products (a row per token against a Linear's weight) read the weight where
  // it lies; each element is the same lane-ordered f32 sum of the (widened) products, which no
  // BLAS kernel reproduces bit for bit.
  const int threads = get_num_threads();
  Generator generator(21);
  for (const auto& [rows, K, N, bf16] : std::vector<std::array<int64_t, 4>>{{1, 768, 200, 1},
                                                                            {3, 37, 130, 1},
                                                                            {16, 5, 64, 1},
                                                                            {2, 1000, 65, 1},
                                                                            {1, 768, 200, 0},
                                                                            {5, 37, 130, 0},
                                                                            {16, 300, 67, 0}}) {
    const DType dtype = bf16 ? DType::bf16 : DType::f32;
    INFO(rows << " x " << K << " by " << K << " x " << N << " in " << dtype);
    const Tensor x = randn({rows, K}, &generator).to(dtype);
    const Tensor w = randn({N, K}, &generator).to(dtype);
    const std::vector<float> xs = x.to_vector<float>(), ws = w.to_vector<float>();
    for (const int t : {1, 2, 4}) {
      set_num_threads(t);
      // The kernel's f32 sums; the product as autograd returns it is they rounded once.
      Tensor out = Tensor::empty({rows, N});
      backend(x).matmul(x, transpose(w, 0, 1), out, false);
      CHECK(bitwise_equal(matmul(x, transpose(w, 0, 1)), out.to(dtype)));
      const std::vector<float> got = out.to_vector<float>();
      int64_t mismatches = 0;
      for (int64_t m = 0; m < rows; ++m) {
        for (int64_t n = 0; n < N; ++n) {
          const float want = lane_dot(&xs[size_t(m * K)], &ws[size_t(n * K)], K);
          if (std::memcmp(&got[size_t(m * N + n)], &want, sizeof want) != 0) ++mismatches;
        }
      }
      CHECK(mismatches == 0);
    }
  }
  // A batch of rows folds into one product: [2, 3, K] rows against a broadcast weight.
  const Tensor x = randn({2, 3, 40}, &generator).to(DType::bf16);
  const Tensor w = randn({9, 40}, &generator).to(DType::bf16);
  Tensor folded = Tensor::empty({2, 3, 9});
  backend(x).matmul(x, expand(transpose(w, 0, 1), {2, 40, 9}), folded, false);
  const std::vector<float> got = folded.to_vector<float>();
  const std::vector<float> xs = x.to_vector<float>(), ws = w.to_vector<float>();
  for (int64_t m = 0; m < 6; ++m) {
    for (int64_t n = 0; n < 9; ++n) {
      const float want = lane_dot(&xs[size_t(m * 40)], &ws[size_t(n * 40)], 40);
      CHECK(std::memcmp(&got[size_t(m * 9 + n)], &want, sizeof want) == 0);
    }
  }
  set_num_threads(threads);
}

namespace {

// Runs `body` with bf16 products on the CPU's bf16 dot product (where it has one) and widened
// to f32, then goes back to the default.
template <typename Body>
void with_each_bf16_path(Body body) {
  set_cpu_bf16_dot(true);
  if (!cpu_bf16_dot()) WARN("this CPU has no AVX512_BF16: bf16 products widen to f32 only");
  for (const bool dot : {true, false}) {
    set_cpu_bf16_dot(dot);
    INFO("bf16 dot product " << (cpu_bf16_dot() ? "on" : "off"));
    try {
      body();
    } catch (...) {
      set_cpu_bf16_dot(true);
      throw;
    }
  }
  set_cpu_bf16_dot(true);
}

// The kernel's f32 result of bf16 a and b, as autocast's matmul computes it before rounding.
Tensor f32_product(const Tensor& a, const Tensor& b, const Tensor& addend = Tensor()) {
  const int64_t r = a.dim();
  std::vector<int64_t> shape = a.shape();
  shape[r - 1] = b.shape()[b.dim() - 1];
  Tensor out = addend.defined() ? expand(addend, shape).contiguous() : Tensor::empty(shape);
  backend(a).matmul(a, b, out, addend.defined());
  return out;
}

}  // namespace

TEST_CASE("bf16 products into f32 match a double-precision reference on either path", "[tensor]") {
  // Shapes around the bf16 kernel's blocks: 6 x 64 micro-tiles, 256-deep and 512-wide blocks,
  // an odd depth (a padded pair), and a product split into tiles.
  Generator generator(14);
  const std::vector<std::array<int64_t, 3>> shapes = {{1, 1, 1},      {3, 5, 7},      {12, 32, 256},
                                                      {13, 33, 257},  {25, 70, 40},   {97, 513, 90},
                                                      {40, 40, 1000}, {300, 333, 200}};
  with_each_bf16_path([&] {
    for (const auto& [M, N, K] : shapes) {
      for (int layout = 0; layout < 4; ++layout) {
        const Tensor a = matrix(M, K, layout & 1, generator).to(DType::bf16);
        const Tensor b = matrix(K, N, layout & 2, generator).to(DType::bf16);
        check_against_reference(a, b, f32_product(a, b));
      }
    }
    const Tensor batch = randn({3, 70, 50}, &generator).to(DType::bf16);
    const Tensor own = transpose(randn({3, 90, 50}, &generator), 1, 2).to(DType::bf16);
    check_against_reference(batch, own, f32_product(batch, own));
    const Tensor x = randn({300, 200}, &generator).to(DType::bf16);
    const Tensor w = transpose(randn({333, 200}, &generator), 0, 1).to(DType::bf16);
    const Tensor bias = randn({333}, &generator);
    check_against_reference(x, w, f32_product(x, w, bias), bias.to_vector<float>());
    // Rows of A followed by NaNs, at an odd and an even depth: nothing past a row's depth may
    // enter a product (the kernel reads row-major rows in place).
    for (const int64_t depth : {int64_t{257}, int64_t{256}}) {
      const Tensor rows = cat({randn({13, depth}, &generator), full({13, 1}, NAN)}, 1);
      const Tensor a = narrow(rows.to(DType::bf16), 1, 0, depth);
      const Tensor b = randn({depth, 70}, &generator).to(DType::bf16);
      check_against_reference(a, b, f32_product(a, b));
    }
  });
}

TEST_CASE("bf16 products into bf16 are the f32 product rounded once, with or without a bias",
          "[tensor]") {
  // On the dot product, products one block deep (K <= 256) round in the kernel, the rest
  // through an f32 stand-in; either way each element is its f32 sum (+ bias) rounded once.
  // Edges of the 6 x 64 micro-tile, every layout, a NaN and infinities in A, subnormal sums.
  Generator generator(16);
  Backend& cpu = backend(Device::cpu());
  with_each_bf16_path([&] {
    for (const auto& [M, N, K] : std::vector<std::array<int64_t, 3>>{
             {40, 70, 128}, {97, 129, 255}, {17, 64, 256}, {30, 40, 300}}) {
      for (int layout = 0; layout < 4; ++layout) {
        INFO(M << " x " << N << " x " << K << " layout " << layout);
        Tensor a32 = matrix(M, K, layout & 1, generator).contiguous();
        a32.data<float>()[0] = NAN;
        a32.data<float>()[1] = INFINITY;
        a32.data<float>()[K + 2] = -INFINITY;
        // Row 5 is zero and the first 8 biases subnormal: those sums are subnormal, which
        // AVX512_BF16's conversion would read as zero.
        std::fill_n(a32.data<float>() + 5 * K, K, 0.0f);
        const Tensor a =
            (layout & 1 ? transpose(transpose(a32, 0, 1).contiguous(), 0, 1) : a32).to(DType::bf16);
        const Tensor b = matrix(K, N, layout & 2, generator).to(DType::bf16);
        const Tensor bias32 = randn({N}, &generator);
        for (int64_t j = 0; j < 8; ++j) bias32.data<float>()[j] *= std::ldexp(1.0f, -130);
        const Tensor bias = bias32.to(DType::bf16);
        const Tensor out = Tensor::empty({M, N}, DType::bf16);
        cpu.matmul(a, b, out, false);
        CHECK(testing::bitwise_equal(out, f32_product(a, b).to(DType::bf16)));
        cpu.matmul_bias(a, b, bias, out);
        CHECK(testing::bitwise_equal(out, f32_product(a, b, bias.to(DType::f32)).to(DType::bf16)));
      }
    }
  });
}

TEST_CASE("bf16 products are the same bits at any thread count", "[tensor]") {
  Generator generator(15);
  const Tensor a = randn({256, 784}, &generator).to(DType::bf16);
  const Tensor w = transpose(randn({1024, 784}, &generator), 0, 1).to(DType::bf16);
  const int threads = get_num_threads();
  with_each_bf16_path([&] {
    set_num_threads(1);
    const std::vector<float> first = f32_product(a, w).to_vector<float>();
    set_num_threads(4);
    CHECK(f32_product(a, w).to_vector<float>() == first);
    set_num_threads(threads);
  });
}
