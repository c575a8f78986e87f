#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "pipit.h"
#include "tensor/backend.h"
#include "tensor/cpu/cpu_allocator.h"
#include "tests/bitwise.h"

using namespace pipit;

TEST_CASE("broadcast add and matmul values", "[tensor]") {
  Tensor a = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = from_vector<float>({10, 20, 30}, {3});
  CHECK((a + b).to_vector<float>() == std::vector<float>{11, 22, 33, 14, 25, 36});
  CHECK(matmul(a, transpose(a, 0, 1)).to_vector<float>() == std::vector<float>{14, 32, 32, 77});
}

TEST_CASE("views share storage with their base", "[tensor]") {
  Tensor base = arange(0, 12, 1, {DType::f32});
  Tensor m = reshape(base, {3, 4});
  Tensor column = narrow(transpose(m, 0, 1), 0, 2, 1);  // column 2 of m
  CHECK(column.same_storage(base));
  CHECK(column.contiguous().to_vector<float>() == std::vector<float>{2, 6, 10});
  backend(column).fill(column, -1.0);
  CHECK(base.to_vector<float>() == std::vector<float>{0, 1, -1, 3, 4, 5, -1, 7, 8, 9, -1, 11});
  Tensor t = transpose(m, 0, 1);
  CHECK_FALSE(t.is_contiguous());
  CHECK(t.contiguous().is_contiguous());
  CHECK(t.contiguous().to_vector<float>() ==
        std::vector<float>{0, 4, 8, 1, 5, 9, -1, -1, -1, 3, 7, 11});
  CHECK(expand(from_vector<float>({1, 2}, {2, 1}), {2, 3}).to_vector<float>() ==
        std::vector<float>{1, 1, 1, 2, 2, 2});
  CHECK(slice(base, 0, 1, 12, 5).to_vector<float>() == std::vector<float>{1, -1, 11});
}

TEST_CASE("factories and the seeded generator", "[tensor]") {
  CHECK(zeros({2, 2}).to_vector<float>() == std::vector<float>(4, 0.0f));
  CHECK(ones({3}, {DType::i64}).to_vector<int64_t>() == std::vector<int64_t>{1, 1, 1});
  CHECK(full({2}, 2.5).to_vector<float>() == std::vector<float>{2.5f, 2.5f});
  CHECK(arange(1, 2, 0.25, {DType::f64}).to_vector<double>() ==
        std::vector<double>{1, 1.25, 1.5, 1.75});
  Generator g1(42), g2(42);
  CHECK(randn({100}, &g1).to_vector<float>() == randn({100}, &g2).to_vector<float>());
  Generator g(7);
  Tensor n = randn({100000}, &g, {DType::f64});
  CHECK(mean(n).item<double>() == Approx(0.0).margin(0.02));
  CHECK(std::sqrt(var(n).item<double>()) == Approx(1.0).epsilon(0.02));
  Tensor u = rand({100000}, &g, {DType::f64});
  CHECK(mean(u).item<double>() == Approx(0.5).margin(0.01));
  CHECK(min(u).item<double>() >= 0.0);
  CHECK(max(u).item<double>() < 1.0);
}

TEST_CASE("reductions and argmax on hand-computed cases", "[tensor]") {
  Tensor x = from_vector<float>({1, 5, 2, 7, 0, 3}, {2, 3});
  CHECK(sum(x, {0}).to_vector<float>() == std::vector<float>{8, 5, 5});
  CHECK(sum(x, {1}, true).shape() == Shape{2, 1});
  CHECK(mean(x, {1}).to_vector<float>()[0] == Approx(8.0 / 3));
  CHECK(mean(x, {1}).to_vector<float>()[1] == Approx(10.0 / 3));
  CHECK(max(x, {1}).to_vector<float>() == std::vector<float>{5, 7});
  CHECK(min(x).item<float>() == 0);
  CHECK(argmax(x, 1).to_vector<int64_t>() == std::vector<int64_t>{1, 0});
  CHECK(argmax(x, 0, true).shape() == Shape{1, 3});
  CHECK(var(from_vector<float>({1, 2, 3, 4})).item<float>() == Approx(5.0 / 3));
  CHECK(var(from_vector<float>({1, 2, 3, 4}), {}, false, 0).item<float>() == Approx(1.25));
}

TEST_CASE("full reductions of every length: each element once, NaN wherever it sits", "[tensor]") {
  // The kernel keeps 8 running results and a tail: lengths around multiples of 8 and of the
  // 16384-element blocks, and a NaN in each lane and in the tail.
  Generator g(11);
  for (const int64_t n : {1, 2, 7, 8, 9, 15, 16, 17, 23, 64, 65, 16383, 16384, 16385, 40001}) {
    INFO("n = " << n);
    const Tensor x = randn({n}, &g);
    const std::vector<float> v = x.to_vector<float>();
    double total = 0;
    float largest = v[0], smallest = v[0];
    for (float e : v) {
      total += e;
      largest = std::max(largest, e);
      smallest = std::min(smallest, e);
    }
    CHECK(sum(x).item<float>() == Approx(total).epsilon(1e-6).margin(1e-6));
    CHECK(max(x).item<float>() == largest);
    CHECK(min(x).item<float>() == smallest);
    for (const int64_t at : {int64_t{0}, (n - 1) / 2, n - 1}) {
      std::vector<float> with_nan = v;
      with_nan[static_cast<size_t>(at)] = std::nanf("");
      const Tensor y = from_vector(with_nan, {n});
      CHECK(std::isnan(max(y).item<float>()));
      CHECK(std::isnan(min(y).item<float>()));
      CHECK(std::isnan(sum(y).item<float>()));
    }
  }
}

TEST_CASE("large tensors take the parallel paths and agree with small ones", "[tensor]") {
  Generator g(3);
  Tensor big = randn({300, 400}, &g, {DType::f64});  // 120000 elements, above the parallel grain
  std::vector<double> values = big.to_vector<double>();
  double total = 0;
  std::vector<double> columns(400, 0.0), rows(300, 0.0);
  for (int64_t r = 0; r < 300; ++r) {
    for (int64_t c = 0; c < 400; ++c) {
      double v = values[static_cast<size_t>(r * 400 + c)];
      total += v;
      columns[static_cast<size_t>(c)] += v;
      rows[static_cast<size_t>(r)] += v;
    }
  }
  CHECK(sum(big).item<double>() == Approx(total).epsilon(1e-12));
  std::vector<double> col = sum(big, {0}).to_vector<double>();
  std::vector<double> row = sum(transpose(big, 0, 1), {0}).to_vector<double>();
  for (size_t c = 0; c < 400; ++c) CHECK(col[c] == Approx(columns[c]).epsilon(1e-12));
  for (size_t r = 0; r < 300; ++r) CHECK(row[r] == Approx(rows[r]).epsilon(1e-12));
  Tensor doubled = big * 2.0 + big;
  std::vector<double> d = doubled.to_vector<double>();
  for (size_t i = 0; i < d.size(); i += 997) CHECK(d[i] == Approx(3 * values[i]));
  // Large enough that GEMMs are split into tiles run on several threads.
  Tensor lhs = randn({256, 512}, &g), rhs = randn({512, 384}, &g);
  Tensor batch_lhs = randn({4, 128, 256}, &g), batch_rhs = randn({4, 256, 128}, &g);
  auto products = [&] {
    return std::vector<std::vector<float>>{
        matmul(lhs, rhs).to_vector<float>(),
        matmul(transpose(rhs, 0, 1), transpose(lhs, 0, 1)).to_vector<float>(),
        matmul(batch_lhs, batch_rhs).to_vector<float>()};
  };
  const int threads = get_num_threads();
  set_num_threads(1);
  const double single = sum(big * big).item<double>();
  const std::vector<double> single_columns = sum(big * big, {0}).to_vector<double>();
  const std::vector<std::vector<float>> single_products = products();
  set_num_threads(4);
  CHECK(sum(big * big).item<double>() == single);  // bit-identical across thread counts
  CHECK(sum(big * big, {0}).to_vector<double>() == single_columns);
  CHECK(products() == single_products);
  set_num_threads(threads);
}

TEST_CASE("reductions over a transposed view's rows give the bits of its contiguous copy",
          "[tensor]") {
  // A bias gradient sums a transposed gradient over its rows; summed where it lies, the order
  // of the sums must still be the copy's, at any thread count and for f32, bf16, f16 and f64.
  Generator g(4);
  const int threads = get_num_threads();
  for (const auto& [rows, cols] :
       std::vector<std::pair<int64_t, int64_t>>{{2048, 131}, {13, 7}, {5, 300}, {1000, 1000}}) {
    for (const DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
      INFO(rows << " x " << cols << " " << dtype);
      const Tensor base =
          randn({rows, cols}, &g, {dtype == DType::f64 ? dtype : DType::f32}).to(dtype);
      const Tensor view = transpose(base, 0, 1);  // [cols, rows], the rows' dim strided
      const Tensor copy = view.contiguous();
      for (const int t : {1, 2, 4}) {
        set_num_threads(t);
        CHECK(sum(view, {1}).to_vector<double>() == sum(copy, {1}).to_vector<double>());
        CHECK(max(view, {1}).to_vector<double>() == max(copy, {1}).to_vector<double>());
        if (is_half(dtype)) {
          // Into f32, as a bias gradient under autocast: the f32 sums, unrounded.
          const Tensor from_view = Tensor::empty({cols, 1}), from_copy = Tensor::empty({cols, 1});
          const int64_t over_rows[] = {1};
          backend(view).reduce(ReduceOp::sum, view, over_rows, from_view);
          backend(copy).reduce(ReduceOp::sum, copy, over_rows, from_copy);
          CHECK(testing::bitwise_equal(from_view, from_copy));
        }
      }
    }
  }
  set_num_threads(threads);
}

TEST_CASE("f16 and bf16 conversions round to nearest even", "[tensor]") {
  Tensor x = from_vector<float>({1.0f, 0.1f, -65504.0f, 1e-8f, 3.0e38f});
  CHECK(x.to(DType::f16).to_vector<float>() ==
        std::vector<float>{1.0f, 0.0999755859375f, -65504.0f, 0.0f, INFINITY});
  CHECK(x.to(DType::bf16).to_vector<float>()[1] == 0.10009765625f);
  CHECK(half_to_float(float_to_half(5.9604645e-8f)) == 5.9604645e-8f);  // smallest subnormal
  CHECK(bfloat16_to_float(float_to_bfloat16(1.00390625f)) == 1.0f);     // tie rounds to even
}

TEST_CASE("bf16 casts give the scalar conversion's bits on rows of unit and other strides",
          "[tensor]") {
  // Ties, NaNs (quiet and signalling, both signs), infinities, subnormals (which AVX512_BF16's
  // conversion would read as zero), then random bits.
  std::vector<uint32_t> bits = {0x3f808000u, 0x3f818000u, 0x7fc00000u, 0x7f800001u,
                                0xffa00000u, 0x7f800000u, 0xff800000u, 0x00000001u,
                                0x807fffffu, 0x7f7fffffu, 0x00400000u, 0x80018000u};
  const Generator g(3);
  for (uint64_t i = 0; bits.size() < 1003; ++i) bits.push_back(static_cast<uint32_t>(g.bits(i)));
  const int64_t n = static_cast<int64_t>(bits.size());
  Tensor pairs = Tensor::empty({n, 2}, DType::f32);
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(pairs.data<float>() + 2 * i, &bits[static_cast<size_t>(i)], 4);
  }
  const Tensor strided = squeeze(narrow(pairs, 1, 0, 1), 1), contiguous = strided.contiguous();
  for (const Tensor& x : {contiguous, strided}) {
    INFO("stride " << x.strides()[0]);
    const Tensor rounded = x.to(DType::bf16), back = rounded.to(DType::f32);
    const Tensor back_strided =
        squeeze(narrow(stack({rounded, rounded}, 1), 1, 1, 1), 1).to(DType::f32);
    size_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t want = float_to_bfloat16(std::bit_cast<float>(bits[static_cast<size_t>(i)]));
      uint16_t got;
      std::memcpy(&got, static_cast<const uint16_t*>(rounded.raw_data()) + i, 2);
      uint32_t widened, widened_strided;
      std::memcpy(&widened, back.data<float>() + i, 4);
      std::memcpy(&widened_strided, back_strided.contiguous().data<float>() + i, 4);
      const uint32_t want_wide = static_cast<uint32_t>(want) << 16;
      wrong += got != want || widened != want_wide || widened_strided != want_wide;
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("comparisons produce masks and where selects", "[tensor]") {
  Tensor a = from_vector<float>({1, 5, 3}), b = from_vector<float>({2, 5, 1});
  CHECK(gt(a, b).dtype() == DType::b8);
  CHECK(gt(a, b).to_vector<bool>() == std::vector<bool>{false, false, true});
  CHECK(eq(a, b).to_vector<bool>() == std::vector<bool>{false, true, false});
  CHECK(where(le(a, b), a, b).to_vector<float>() == std::vector<float>{1, 5, 1});
  CHECK(masked_fill(a, ne(a, b), 0.0).to_vector<float>() == std::vector<float>{0, 5, 0});
}

TEST_CASE("errors name the op and the shapes", "[tensor]") {
  Tensor a = zeros({2, 3}), b = zeros({4});
  CHECK_THROWS_WITH(a + b,
                    Catch::Contains("add") && Catch::Contains("[2, 3]") && Catch::Contains("[4]"));
  CHECK_THROWS_WITH(sum(a, {2}), Catch::Contains("sum") && Catch::Contains("dim 2"));
  CHECK_THROWS_WITH(matmul(a, a), Catch::Contains("matmul") && Catch::Contains("inner dims"));
  CHECK_THROWS_WITH(a * zeros({2, 3}, {DType::i64}), Catch::Contains("dtypes differ"));
  CHECK_THROWS_WITH(reshape(a, {4, 2}), Catch::Contains("reshape") && Catch::Contains("[4, 2]"));
  CHECK_THROWS_WITH(view(transpose(a, 0, 1), {6}), Catch::Contains("use reshape"));
  CHECK_THROWS_WITH(embedding(zeros({3, 2}), from_vector<int64_t>({3})),
                    Catch::Contains("index 3"));
  CHECK_THROWS_WITH(a.item<float>(), Catch::Contains("6 elements"));
  CHECK_THROWS_WITH(a.data<double>(), Catch::Contains("F32"));
  // A kernel's dtype switch names the op, the dtype and what it takes.
  Backend& cpu = backend(Device::cpu());
  Generator g(3);
  const Tensor ints = zeros({2}, {DType::i64});
  CHECK_THROWS_WITH(cpu.uniform(ints, g, 0, 1),
                    Catch::Equals("uniform: dtype I64 is not supported (expected F32 or F64)"));
  CHECK_THROWS_WITH(
      cpu.dropout(ints, g, 0.5, ints, zeros({2}, {DType::b8})),
      Catch::Contains("dropout: dtype I64 is not supported (expected a float dtype)"));
}

TEST_CASE("printing shows shape, dtype and abbreviated values", "[tensor]") {
  std::ostringstream out;
  out << arange(0, 100, 1, {DType::f32});
  const std::string text = out.str();
  CHECK(text.find("shape=[100]") != std::string::npos);
  CHECK(text.find("dtype=F32") != std::string::npos);
  CHECK(text.find("0, 1, 2, ..., 97, 98, 99") != std::string::npos);
}

TEST_CASE("the CPU allocator accounts for live and peak bytes", "[tensor]") {
  const MemoryStats before = cpu_memory_stats();
  reset_cpu_peak_memory();
  {
    Tensor big = zeros({1024, 256});  // 1 MiB
    CHECK(cpu_memory_stats().allocated >= before.allocated + (1 << 20));
  }
  const MemoryStats after = cpu_memory_stats();
  CHECK(after.allocated == before.allocated);
  CHECK(after.peak_allocated >= before.allocated + (1 << 20));
  cpu_empty_cache();
  CHECK(cpu_memory_stats().reserved == 0);
}

// exp, tanh and sigmoid run pipit's own vectorized float math (tensor/cpu/vec_math.h), not
// libm: checked here against libm in double over the float range, with the special values,
// and for bit-equality between the vectorized contiguous path and the strided scalar path.
TEST_CASE("float exp tanh and sigmoid within 3 ulp of libm and row kernels bit-equal to scalar",
          "[tensor]") {
  std::vector<float> xs = {0.0f,   -0.0f,   1e-30f,  -1e-30f, 1e-8f,    -3e-5f,   0.624f,
                           0.625f, 0.626f,  -0.625f, 9.0f,    -9.0f,    20.0f,    -20.0f,
                           88.7f,  -103.9f, -150.0f, 200.0f,  INFINITY, -INFINITY};
  for (int i = 0; i <= 40000; ++i) xs.push_back(-25.0f + 50.0f * static_cast<float>(i) / 40000);
  const int64_t n = static_cast<int64_t>(xs.size());
  const Tensor x = from_vector<float>(xs, {n});
  // The same values as a strided view (every other element of a wider tensor).
  std::vector<float> wide(2 * xs.size(), 7.0f);
  for (size_t i = 0; i < xs.size(); ++i) wide[2 * i] = xs[i];
  const Tensor strided = slice(from_vector<float>(wide, {2 * n}), 0, 0, 2 * n, 2);
  REQUIRE_FALSE(strided.is_contiguous());
  auto ulps = [](float got, double want) {
    const float w = static_cast<float>(want);
    if (std::isnan(w)) return std::isnan(got) ? 0.0 : 1e9;
    if (got == w) return 0.0;
    if (std::isinf(w) || std::isinf(got)) return 1e9;
    // Below the smallest normal, count ulps of the smallest normal.
    const double ulp = std::max(std::abs(std::nextafter(w, INFINITY) - w),
                                std::nextafter(std::numeric_limits<float>::min(), 1.0f) -
                                    std::numeric_limits<float>::min());
    return std::abs(static_cast<double>(got) - want) / ulp;
  };
  struct Case {
    const char* name;
    Tensor (*op)(const Tensor&);
    double (*reference)(double);
  };
  const Case cases[] = {
      {"exp", [](const Tensor& t) { return exp(t); }, [](double v) { return std::exp(v); }},
      {"tanh", [](const Tensor& t) { return tanh(t); }, [](double v) { return std::tanh(v); }},
      {"sigmoid", [](const Tensor& t) { return sigmoid(t); },
       [](double v) { return 1.0 / (1.0 + std::exp(-v)); }},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    const std::vector<float> got = c.op(x).to_vector<float>();
    CHECK(c.op(strided).to_vector<float>() == got);
    double worst = 0;
    float worst_x = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const double e = ulps(got[i], c.reference(static_cast<double>(xs[i])));
      if (e > worst) {
        worst = e;
        worst_x = xs[i];
      }
    }
    INFO("worst at x = " << worst_x);
    CHECK(worst <= 3.0);
  }
  // GELU and its gradient: the vectorized contiguous path against the strided scalar one.
  Tensor contiguous_leaf = x.detach().requires_grad_(), strided_leaf = strided.detach();
  strided_leaf.requires_grad_();
  const Tensor y = gelu(contiguous_leaf), y_strided = gelu(strided_leaf);
  CHECK(testing::bitwise_equal(y, y_strided));
  y.backward(ones_like(y));
  y_strided.backward(ones_like(y_strided));
  CHECK(testing::bitwise_equal(contiguous_leaf.grad(), strided_leaf.grad()));
  const Tensor nan = from_vector<float>({NAN}, {1});
  CHECK(std::isnan(exp(nan).to_vector<float>()[0]));
  CHECK(std::isnan(tanh(nan).to_vector<float>()[0]));
  CHECK(std::isnan(sigmoid(nan).to_vector<float>()[0]));
}
