// The CUDA backend against the CPU backend: every Backend op on fresh random inputs, a short
// training run, and the caching allocator. Without a CUDA device (or without CUDA in the
// build) each test reports "skipped" through a Catch2 warning and passes.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <tuple>

#include "bitwise.h"
#include "cuda_testing.h"
#include "optim/optimizer.h"
#include "pipit.h"
#ifdef PIPIT_WITH_CUDA
#include "tensor/cuda/cuda_device.h"
#endif

using namespace pipit;
using namespace testing::cuda_testing;

namespace {

// Every element of `got` (any device) within tol of `want` relative to the larger of |want|
// and the mean magnitude of want, so sums that cancel are not held to a tighter bound.
void check_close(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  INFO(what);
  REQUIRE(got.shape() == want.shape());
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  double scale = 0;
  for (double v : w) scale += std::abs(v);
  scale = w.empty() ? 0 : scale / static_cast<double>(w.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const bool ok = std::isnan(w[i])
                        ? std::isnan(g[i])
                        : std::abs(g[i] - w[i]) <= tol * std::max(std::abs(w[i]), scale);
    if (!ok && bad++ == 0) first = i;
  }
  INFO("first mismatch at " << first << ": got " << (g.empty() ? 0 : g[first]) << ", want "
                            << (w.empty() ? 0 : w[first]));
  CHECK(bad == 0);
}

// Runs op once on CPU copies of `inputs` and once on CUDA copies, then compares every output.
// op receives the device and the inputs there and returns its (poisoned, then written) outputs.
using Op = std::function<std::vector<Tensor>(Device, const std::vector<Tensor>&)>;

void compare_devices(const std::string& what, const std::vector<Tensor>& inputs, const Op& op,
                     double tol) {
  std::vector<Tensor> on_gpu;
  for (const Tensor& t : inputs) on_gpu.push_back(t.to(kCuda));
  const std::vector<Tensor> want = op(kCpu, inputs);
  const std::vector<Tensor> got = op(kCuda, on_gpu);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i].device() == kCuda);
    check_close(got[i], want[i], tol, what + " output " + std::to_string(i));
  }
}

}  // namespace

TEST_CASE("cuda: devices are reported, missing ones are errors", "[cuda]") {
#ifdef PIPIT_WITH_CUDA
  CHECK(cuda::device_count() >= 0);
  CHECK(cuda::is_available() == (cuda::device_count() > 0));
  const Device missing = Device::cuda(cuda::device_count());
  CHECK_THROWS_WITH(backend(missing), Catch::Contains("not available"));
  CHECK_THROWS_WITH(Tensor::empty({2}, DType::f32, missing), Catch::Contains("not available"));
#else
  CHECK_THROWS_WITH(backend(kCuda), Catch::Contains("built without CUDA"));
  CHECK_THROWS_WITH(zeros({2}, {DType::f32, kCuda}), Catch::Contains("built without CUDA"));
#endif
}

TEST_CASE("cuda: copies between host and device, strides and dtypes", "[cuda]") {
  if (!cuda_ready()) return;
  Generator g(1);
  const std::vector<DType> dtypes = {DType::f32, DType::f64, DType::i32, DType::i64,
                                     DType::b8,  DType::f16, DType::bf16};
  Tensor source = random({5, 7}, DType::f64, g, -50, 50);
  for (DType dt : dtypes) {
    Tensor host = source.to(dt);
    Tensor back = host.to(kCuda).to(kCpu);
    CHECK(back.dtype() == dt);
    check_close(back, host, 0, "round trip");
    // Strided on the device, converted on the device, strided into the host.
    Tensor t = transpose(host.to(kCuda), 0, 1);
    check_close(t.contiguous(), transpose(host, 0, 1).contiguous(), 0, "strided device copy");
    for (DType to : dtypes) {
      Tensor converted = poisoned(t.shape(), to, kCuda);
      backend(kCuda).copy(t, converted);
      Tensor want = Tensor::empty(t.shape(), to);
      backend(kCpu).copy(transpose(host, 0, 1), want);
      check_close(converted, want, 0, "device conversion");
    }
    Tensor host_out = poisoned({7, 5}, dt, kCpu);
    Tensor strided_host = transpose(host_out, 0, 1);
    backend(kCuda).copy(host.to(kCuda), strided_host);
    check_close(strided_host, host, 0, "device to strided host");
    Tensor dev_out = poisoned({7, 5}, dt, kCuda);
    backend(kCuda).copy(host, transpose(dev_out, 0, 1));
    check_close(transpose(dev_out, 0, 1), host, 0, "host to strided device");
  }
  Tensor big = from_vector<int64_t>({(int64_t{1} << 62) + 1, -3});
  CHECK(big.to(kCuda).to(kCpu).to_vector<int64_t>() == big.to_vector<int64_t>());
}

TEST_CASE("cuda: fill, arange and the random generator match the CPU", "[cuda]") {
  if (!cuda_ready()) return;
  for (DType dt : {DType::f32, DType::f64, DType::i32, DType::i64}) {
    compare_devices(
        "fill", {},
        [&](Device d, auto&) {
          Tensor t = poisoned({3, 4}, dt, d);
          backend(d).fill(t, 3.0);
          Tensor view = narrow(t, 1, 1, 2);
          backend(d).fill(view, -1.0);
          return std::vector<Tensor>{t};
        },
        0);
    compare_devices(
        "arange", {},
        [&](Device d, auto&) {
          Tensor t = poisoned({37}, dt, d);
          backend(d).arange(t, 2.0, 3.0);
          return std::vector<Tensor>{t};
        },
        0);
  }
  for (DType dt : {DType::f32, DType::f64}) {
    Generator cpu_gen(99), gpu_gen(99);
    cpu_gen.reserve(17);
    gpu_gen.reserve(17);
    Tensor u_cpu = uniform({1000}, -1, 3, &cpu_gen, {dt});
    Tensor u_gpu = uniform({1000}, -1, 3, &gpu_gen, {dt, kCuda});
    check_close(u_gpu, u_cpu, 0, "uniform draws the CPU's numbers");
    Tensor n_cpu = normal({1001}, 0.5, 2, &cpu_gen, {dt});
    Tensor n_gpu = normal({1001}, 0.5, 2, &gpu_gen, {dt, kCuda});
    // Device log and cos may differ from libm in the last bit.
    check_close(n_gpu, n_cpu, dt == DType::f64 ? 1e-14 : 1e-6, "normal draws the CPU's numbers");
    CHECK(cpu_gen.offset() == gpu_gen.offset());
  }
}

TEST_CASE("cuda: unary, binary and where with broadcasting", "[cuda]") {
  if (!cuda_ready()) return;
  Generator g(2);
  const std::vector<UnaryOp> float_unary = {UnaryOp::neg,     UnaryOp::exp,  UnaryOp::log,
                                            UnaryOp::sqrt,    UnaryOp::abs,  UnaryOp::tanh,
                                            UnaryOp::sigmoid, UnaryOp::relu, UnaryOp::gelu};
  for (DType dt : {DType::f32, DType::f64}) {
    for (UnaryOp op : float_unary) {
      const bool positive = op == UnaryOp::log || op == UnaryOp::sqrt;
      Tensor x = random({6, 33}, dt, g, positive ? 0.1 : -4, 4);
      compare_devices(
          "unary " + std::to_string(static_cast<int>(op)), {x},
          [&](Device d, const std::vector<Tensor>& in) {
            Tensor xt = transpose(in[0], 0, 1);  // strided input
            Tensor out = poisoned(xt.shape(), dt, d);
            backend(d).unary(op, xt, out);
            return std::vector<Tensor>{out};
          },
          tol_for(dt));
    }
  }
  for (DType dt : {DType::i32, DType::i64}) {
    for (UnaryOp op : {UnaryOp::neg, UnaryOp::abs, UnaryOp::relu}) {
      Tensor x = random({40}, DType::f64, g, -100, 100).to(dt);
      compare_devices(
          "integer unary", {x},
          [&](Device d, const std::vector<Tensor>& in) {
            Tensor out = poisoned(in[0].shape(), dt, d);
            backend(d).unary(op, in[0], out);
            return std::vector<Tensor>{out};
          },
          0);
    }
  }
  const std::vector<BinaryOp> arithmetic = {BinaryOp::add,
                                            BinaryOp::sub,
                                            BinaryOp::mul,
                                            BinaryOp::div,
                                            BinaryOp::pow,
                                            BinaryOp::maximum,
                                            BinaryOp::minimum,
                                            BinaryOp::relu_backward,
                                            BinaryOp::gelu_backward,
                                            BinaryOp::tanh_backward,
                                            BinaryOp::sigmoid_backward};
  const std::vector<BinaryOp> comparisons = {BinaryOp::eq, BinaryOp::ne, BinaryOp::lt,
                                             BinaryOp::le, BinaryOp::gt, BinaryOp::ge};
  const Shape shape = {4, 3, 5};
  for (DType dt : {DType::f32, DType::f64, DType::i64}) {
    const bool floating = is_floating(dt);
    Tensor a = random({4, 1, 5}, DType::f64, g, 0.5, 3).to(dt);
    Tensor b = random({3, 5}, DType::f64, g, 0.5, 3).to(dt);
    for (BinaryOp op : arithmetic) {
      if (!floating && op != BinaryOp::add && op != BinaryOp::sub && op != BinaryOp::mul &&
          op != BinaryOp::maximum && op != BinaryOp::minimum) {
        continue;
      }
      compare_devices(
          "binary " + std::to_string(static_cast<int>(op)), {a, b},
          [&](Device d, const std::vector<Tensor>& in) {
            Tensor out = poisoned(shape, dt, d);
            backend(d).binary(op, expand(in[0], shape), expand(in[1], shape), out);
            return std::vector<Tensor>{out};
          },
          floating ? tol_for(dt) : 0);
    }
    // Half the elements equal, so that eq, le and ge see ties.
    Tensor c = where(gt(random({4, 1, 5}, DType::f32, g), scalar_tensor(0, {DType::f32})), a,
                     a + scalar_like(a, 1));
    for (BinaryOp op : comparisons) {
      compare_devices(
          "compare", {a, c},
          [&](Device d, const std::vector<Tensor>& in) {
            Tensor out = poisoned({4, 1, 5}, DType::b8, d);
            backend(d).binary(op, in[0], in[1], out);
            return std::vector<Tensor>{out};
          },
          0);
    }
    Tensor mask = gt(random({3, 1}, DType::f32, g), scalar_tensor(0, {DType::f32}));
    compare_devices(
        "where", {mask, a, b},
        [&](Device d, const std::vector<Tensor>& in) {
          Tensor out = poisoned(shape, dt, d);
          backend(d).where(expand(in[0], shape), expand(in[1], shape), expand(in[2], shape), out);
          return std::vector<Tensor>{out};
        },
        0);
  }
}

TEST_CASE("cuda: reductions over any dims and argmax", "[cuda]") {
  if (!cuda_ready()) return;
  Generator g(3);
  const std::vector<std::vector<int64_t>> dim_sets = {{}, {0}, {1}, {2}, {0, 2}, {1, 2}, {0, 1, 2}};
  // Small, medium (a warp per output) and long (a block per output) reductions.
  for (const Shape& shape : {Shape{3, 4, 5}, Shape{2, 70, 9}, Shape{3, 2, 3000}}) {
    for (DType dt : {DType::f32, DType::f64, DType::i64}) {
      Tensor x = random(shape, DType::f64, g, -100, 100).to(dt);
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
        for (const auto& dims : dim_sets) {
          compare_devices(
              "reduce", {x},
              [&](Device d, const std::vector<Tensor>& in) {
                Tensor xt = transpose(in[0], 0, 2);  // strided input
                Shape kept = xt.shape();
                for (int64_t dim : dims) kept[static_cast<size_t>(dim)] = 1;
                Tensor out = poisoned(kept, dt, d);
                backend(d).reduce(op, xt, dims, out);
                return std::vector<Tensor>{out};
              },
              is_floating(dt) ? 1e-6 : 0);
        }
      }
      for (int64_t dim = 0; dim < 3; ++dim) {
        compare_devices(
            "argmax", {x},
            [&](Device d, const std::vector<Tensor>& in) {
              Shape kept = shape;
              kept[static_cast<size_t>(dim)] = 1;
              Tensor out = poisoned(kept, DType::i64, d);
              backend(d).argmax(in[0], dim, out);
              return std::vector<Tensor>{out};
            },
            0);
      }
    }
  }
}

TEST_CASE("cuda: reductions over the leading dims of contiguous tensors match the CPU", "[cuda]") {
  if (!cuda_ready()) return;
  Generator g(4);
  // Bias gradients and the like: [rows, columns] with rows reduced, split into chunks of rows
  // whose partial results are combined in order; a size-1 dim between does not matter.
  struct Case {
    Shape shape;
    std::vector<int64_t> dims;
  };
  for (const Case& c : {Case{{600, 70}, {0}}, Case{{3, 300, 40}, {0, 1}},
                        Case{{2, 1, 9, 33}, {0, 2}}, Case{{70000, 33}, {0}}}) {
    for (DType dt : {DType::f32, DType::f64, DType::i32, DType::i64}) {
      INFO(shape_str(c.shape) << " " << dt);
      const Tensor x = random(c.shape, DType::f64, g, -100, 100).to(dt);
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
        compare_devices(
            "reduce", {x},
            [&](Device d, const std::vector<Tensor>& in) {
              Shape kept = c.shape;
              for (int64_t dim : c.dims) kept[static_cast<size_t>(dim)] = 1;
              Tensor out = poisoned(kept, dt, d);
              backend(d).reduce(op, in[0], c.dims, out);
              return std::vector<Tensor>{out};
            },
            is_floating(dt) ? 1e-6 : 0);
      }
    }
  }
}

TEST_CASE("cuda: matmul through cuBLAS, transposed, batched, broadcast, accumulated", "[cuda]") {
  if (!cuda_ready()) return;
  Generator g(4);
  for (DType dt : {DType::f32, DType::f64}) {
    const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
    auto mm = [&](const std::string& what, Tensor a, Tensor b, auto prepare, bool accumulate) {
      compare_devices(
          what, {a, b},
          [&](Device d, const std::vector<Tensor>& in) {
            auto [x, y] = prepare(in[0], in[1]);
            Shape out_shape = x.shape();
            out_shape.back() = y.shape().back();
            Tensor out = poisoned(out_shape, dt, d);
            if (accumulate) backend(d).fill(out, 0.5);
            backend(d).matmul(x, y, out, accumulate);
            return std::vector<Tensor>{out};
          },
          tol);
    };
    auto as_is = [](const Tensor& x, const Tensor& y) { return std::pair{x, y}; };
    mm("2-D", random({17, 33}, dt, g), random({33, 9}, dt, g), as_is, false);
    mm("accumulate", random({17, 33}, dt, g), random({33, 9}, dt, g), as_is, true);
    mm(
        "transposed", random({33, 17}, dt, g), random({9, 33}, dt, g),
        [](const Tensor& x, const Tensor& y) {
          return std::pair{transpose(x, 0, 1), transpose(y, 0, 1)};
        },
        false);
    mm("batched", random({3, 17, 33}, dt, g), random({3, 33, 9}, dt, g), as_is, false);
    mm(
        "broadcast weight", random({2, 3, 17, 33}, dt, g), random({33, 9}, dt, g),
        [](const Tensor& x, const Tensor& y) {
          return std::pair{x, expand(y, {2, 3, 33, 9})};
        },
        false);
    mm(
        "broadcast input", random({17, 33}, dt, g), random({4, 33, 9}, dt, g),
        [](const Tensor& x, const Tensor& y) {
          return std::pair{expand(x, {4, 17, 33}), y};
        },
        false);
    mm(
        "strided batch", random({3, 33, 17}, dt, g), random({9, 33, 3}, dt, g),
        [](const Tensor& x, const Tensor& y) {
          return std::pair{transpose(x, 1, 2), permute(y, {2, 1, 0})};
        },
        false);
  }
}

TEST_CASE("cuda: softmax, layer norm, embedding and cross-entropy kernels", "[cuda]") {
  if (!cuda_ready()) return;
  Generator g(5);
  for (DType dt : {DType::f32, DType::f64}) {
    const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
    for (bool log : {false, true}) {
      for (int64_t dim : {0, 1, 2}) {
        Tensor x = random({4, 300, 6}, dt, g, -5, 5);
        Tensor grad = random({4, 300, 6}, dt, g);
        compare_devices(
            "softmax", {x, grad},
            [&](Device d, const std::vector<Tensor>& in) {
              Tensor out = poisoned(in[0].shape(), dt, d);
              backend(d).softmax(in[0], dim, log, out);
              Tensor grad_in = poisoned(in[0].shape(), dt, d);
              backend(d).softmax_backward(in[1], out, dim, log, grad_in);
              return std::vector<Tensor>{out, grad_in};
            },
            tol);
      }
    }
    // Rows of 7 are read one element at a time, rows of 300 16 bytes at a time; 600 rows make
    // three chunks of the weight and bias gradients' partial sums.
    for (const auto& shape :
         std::vector<std::pair<int64_t, int64_t>>{{130, 7}, {130, 300}, {600, 300}}) {
      const int64_t R = shape.first, C = shape.second;
      Tensor x = random({R, C}, dt, g, -3, 5);
      Tensor w = random({C}, dt, g), b = random({C}, dt, g), grad = random({R, C}, dt, g);
      Tensor residual = random({R, C}, dt, g);
      compare_devices(
          "layer_norm", {x, w, b, grad, residual},
          [&](Device d, const std::vector<Tensor>& in) {
            Tensor out = poisoned({R, C}, dt, d);
            Tensor mean = poisoned({R}, dt, d), rstd = poisoned({R}, dt, d);
            backend(d).layer_norm(in[0], in[1], in[2], 1e-5, out, mean, rstd);
            Tensor gx = poisoned({R, C}, dt, d);
            Tensor gw = poisoned({C}, dt, d), gb = poisoned({C}, dt, d);
            backend(d).layer_norm_backward(in[3], in[0], in[1], mean, rstd, Tensor(), gx, gw, gb);
            // With a residual: a separate add's bits, also written over the residual itself.
            Tensor summed = poisoned({R, C}, dt, d), in_place = in[4].clone();
            backend(d).layer_norm_backward(in[3], in[0], in[1], mean, rstd, in[4], summed, gw, gb);
            backend(d).layer_norm_backward(in[3], in[0], in[1], mean, rstd, in_place, in_place, gw,
                                           gb);
            CHECK(testing::bitwise_equal(summed.to(kCpu), (in[4] + gx).to(kCpu)));
            CHECK(testing::bitwise_equal(in_place.to(kCpu), summed.to(kCpu)));
            return std::vector<Tensor>{out, mean, rstd, gx, gw, gb, summed};
          },
          dt == DType::f64 ? 1e-11 : 1e-5);
    }
    Tensor weight = random({11, 6}, dt, g);
    Tensor indices = from_vector<int64_t>({3, 0, 10, 3, 3, 7}, {2, 3});
    Tensor grad = random({2, 3, 6}, dt, g);
    compare_devices(
        "embedding", {weight, indices, grad},
        [&](Device d, const std::vector<Tensor>& in) {
          Tensor out = poisoned({2, 3, 6}, dt, d);
          backend(d).embedding(in[0], in[1], out);
          Tensor gw = zeros({11, 6}, {dt, d});
          backend(d).embedding_backward(in[2], in[1], gw);
          return std::vector<Tensor>{out, gw};
        },
        tol);
    // A bad index is raised at the next read-back, not by the op (which does not wait for
    // the device), and reads as 0 until then.
    Tensor out = Tensor::empty({2, 6}, dt, kCuda);
    backend(kCuda).embedding(weight.to(kCuda), from_vector<int64_t>({3, 11}).to(kCuda), out);
    CHECK_THROWS_WITH(out.to(kCpu), Catch::Contains("embedding: index 11 at position 1 is out "
                                                    "of range for 11 rows"));
    // Raised once: the next read-back is clean.
    const std::vector<double> row = out.to(kCpu).to_vector<double>();
    CHECK(row[6] == 0);
    CHECK(row[0] == weight.to_vector<double>()[18]);
    // Rows of 1000 are read 16 bytes at a time (all dtypes), rows of 1003 and 5 one by one.
    for (int64_t C : {5, 1000, 1003}) {
      Tensor logits = random({9, C}, dt, g, -4, 4);
      Tensor targets = from_vector<int64_t>({0, 4, -100, 2, 1, -100, 3, 0, 4}, {9});
      compare_devices(
          "cross_entropy", {logits, targets},
          [&](Device d, const std::vector<Tensor>& in) {
            Tensor losses = poisoned({9}, dt, d), stats = poisoned({9, 2}, dt, d);
            backend(d).cross_entropy(in[0], in[1], -100, losses, stats);
            const Tensor scale = scalar_tensor(0.25, {dt, d});
            Tensor gl = poisoned({9, C}, dt, d), recomputed = poisoned({9, C}, dt, d);
            backend(d).cross_entropy_backward(in[0], in[1], -100, scale, stats, gl);
            backend(d).cross_entropy_backward(in[0], in[1], -100, scale, Tensor(), recomputed);
            CHECK(testing::bitwise_equal(
                gl.to(kCpu), recomputed.to(kCpu)));  // the saved stats are the backward's own bits
            // In place, as the loss's node runs it where only it holds the logits.
            for (const Tensor& row_stats : {stats, Tensor()}) {
              Tensor in_place = in[0].clone();
              backend(d).cross_entropy_backward(in_place, in[1], -100, scale, row_stats, in_place);
              CHECK(testing::bitwise_equal(in_place.to(kCpu), gl.to(kCpu)));
            }
            return std::vector<Tensor>{losses, stats, gl};
          },
          tol);
    }
    Tensor losses = Tensor::empty({1}, dt, kCuda);
    backend(kCuda).cross_entropy(random({1, 5}, dt, g).to(kCuda),
                                 from_vector<int64_t>({5}).to(kCuda), -100, losses, Tensor());
    CHECK_THROWS_WITH(synchronize(kCuda),
                      Catch::Contains("cross_entropy: target 5 at row 0 is out of range for 5 "
                                      "classes"));
    CHECK(std::isnan(losses.item<double>()));
  }
}

namespace {

// Every element equal, NaN (a poisoned element left unwritten) never.
void check_same_values(const Tensor& got, const Tensor& want, const std::string& what) {
  INFO(what);
  REQUIRE(got.shape() == want.shape());
  CHECK(got.dtype() == want.dtype());
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  size_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i) bad += !(g[i] == w[i]);
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("cuda: a widening add and layer norm's half results and gradients equal f32 ones cast",
          "[cuda]") {
  if (!cuda_ready()) return;
  Generator g(21);
  for (DType half : {DType::bf16, DType::f16}) {
    INFO("half dtype " << half);
    // f32 + half into f32, both operand orders: the packed path (1003 = 250 packs of 4 and 3
    // more) and a broadcast strided one, the sums of the f32 add after a cast.
    for (const auto& [a_shape, b_shape, shape] : std::vector<std::tuple<Shape, Shape, Shape>>{
             {{1003}, {1003}, {1003}}, {{4, 1, 5}, {3, 5}, {4, 3, 5}}}) {
      const Tensor a = random(a_shape, DType::f32, g).to(kCuda);
      const Tensor b = random(b_shape, DType::f32, g).to(half).to(kCuda);
      Tensor want = poisoned(shape, DType::f32, kCuda);
      backend(kCuda).binary(BinaryOp::add, expand(a, shape), expand(b.to(DType::f32), shape), want);
      for (bool half_first : {false, true}) {
        Tensor got = poisoned(shape, DType::f32, kCuda);
        const Tensor x = expand(half_first ? b : a, shape), y = expand(half_first ? a : b, shape);
        backend(kCuda).binary(BinaryOp::add, x, y, got);
        check_same_values(got, want, "widening add");
        Tensor on_cpu = poisoned(shape, DType::f32, kCpu);
        backend(kCpu).binary(BinaryOp::add, x.to(kCpu), y.to(kCpu), on_cpu);
        check_same_values(got.to(kCpu), on_cpu, "widening add on the CPU");
      }
    }
    // Rows of 7 one element at a time, rows of 300 in packs (8-byte half loads).
    for (const auto& [R, C] : std::vector<std::pair<int64_t, int64_t>>{{130, 7}, {600, 300}}) {
      const Tensor x = random({R, C}, DType::f32, g, -3, 5).to(kCuda);
      const Tensor w = random({C}, DType::f32, g).to(kCuda),
                   b = random({C}, DType::f32, g).to(kCuda);
      const Tensor grad = random({R, C}, DType::f32, g).to(half).to(kCuda);
      // The f32 kernels, their output cast and their gradient from the half one widened.
      Tensor out = poisoned({R, C}, DType::f32, kCuda);
      Tensor mean = poisoned({R}, DType::f32, kCuda), rstd = poisoned({R}, DType::f32, kCuda);
      backend(kCuda).layer_norm(x, w, b, 1e-5, out, mean, rstd);
      Tensor gx = poisoned({R, C}, DType::f32, kCuda);
      Tensor gw = poisoned({C}, DType::f32, kCuda), gb = poisoned({C}, DType::f32, kCuda);
      backend(kCuda).layer_norm_backward(grad.to(DType::f32), x, w, mean, rstd, Tensor(), gx, gw,
                                         gb);
      for (Device d : {kCuda, kCpu}) {
        INFO("layer norm with half output and gradient on " << d);
        Tensor out_h = poisoned({R, C}, half, d);
        Tensor mean_h = poisoned({R}, DType::f32, d), rstd_h = poisoned({R}, DType::f32, d);
        backend(d).layer_norm(x.to(d), w.to(d), b.to(d), 1e-5, out_h, mean_h, rstd_h);
        Tensor gx_h = poisoned({R, C}, DType::f32, d);
        Tensor gw_h = poisoned({C}, DType::f32, d), gb_h = poisoned({C}, DType::f32, d);
        backend(d).layer_norm_backward(grad.to(d), x.to(d), w.to(d), mean_h, rstd_h, Tensor(), gx_h,
                                       gw_h, gb_h);
        if (d == kCuda) {
          check_same_values(out_h, out.to(half), "output");
          check_same_values(mean_h, mean, "mean");
          check_same_values(gx_h, gx, "grad_x");
          check_same_values(gw_h, gw, "grad_weight");
          check_same_values(gb_h, gb, "grad_bias");
        } else {
          // The CPU sums in another order: within f32 roundoff, and the output within one step
          // of the half dtype.
          check_close(out_h.to(kCuda).to(DType::f32), out,
                      half == DType::bf16 ? 1.0 / 256 : 1.0 / 2048, "output against the CPU");
          check_close(gx_h, gx.to(kCpu), 1e-5, "grad_x against the CPU");
          check_close(gw_h, gw.to(kCpu), 1e-5, "grad_weight against the CPU");
          check_close(gb_h, gb.to(kCpu), 1e-5, "grad_bias against the CPU");
        }
      }
    }
  }
  // Other pairs of dtypes are refused, naming them.
  const Tensor f = random({4}, DType::f32, g).to(kCuda), h = f.to(DType::bf16);
  CHECK_THROWS_WITH(backend(kCuda).binary(BinaryOp::mul, f, h, poisoned({4}, DType::f32, kCuda)),
                    Catch::Contains("mul: operands of dtypes F32 and BF16"));
  CHECK_THROWS_WITH(
      backend(kCuda).layer_norm(f.to(DType::f64), f.to(DType::f64), f.to(DType::f64), 1e-5,
                                poisoned({4}, DType::bf16, kCuda), poisoned({1}, DType::f64, kCuda),
                                poisoned({1}, DType::f64, kCuda)),
      Catch::Contains("layer_norm: BF16 with an input of F64"));
}

TEST_CASE("cuda: causal softmax and its backward match the CPU", "[cuda]") {
  if (!cuda_ready()) return;
  Generator g(8);
  for (DType dt : {DType::f32, DType::f64}) {
    // Rows held in registers (T <= 1024) and longer ones read from memory for each pass.
    for (int64_t T : {1, 5, 33, 1024, 1500}) {
      INFO(dt << ", T " << T);
      const Shape shape = T < 1000 ? Shape{2, 3, T, T} : Shape{2, T, T};
      const Tensor scores = random(shape, dt, g, -6, 6), grad = random(shape, dt, g);
      compare_devices(
          "causal_softmax", {scores, grad},
          [&](Device d, const std::vector<Tensor>& in) {
            Tensor out = poisoned(shape, dt, d);
            backend(d).causal_softmax(in[0], 0.125, out);
            Tensor grad_scores = poisoned(shape, dt, d);
            backend(d).causal_softmax_backward(in[1], out, 0.125, grad_scores);
            return std::vector<Tensor>{out, grad_scores};
          },
          tol_for(dt));
    }
  }
}

TEST_CASE("cuda: embedding gradients add in index order, to the CPU's bits on every run",
          "[cuda]") {
  if (!cuda_ready()) return;
  Generator g(6);
  for (DType dt : {DType::f32, DType::f64}) {
    INFO(dt);
    // 6000 lookups of rows 0-29 of 37, about 200 per row: added in any other order than the
    // indices', a row's last bits differ.
    std::vector<int64_t> rows;
    for (int64_t i = 0; i < 6000; ++i) rows.push_back((i * 7919 + i / 13) % 30);
    const Tensor indices = from_vector(rows, {60, 100});
    const Tensor grad = random({60, 100, 48}, dt, g), start = random({37, 48}, dt, g);
    auto gradient = [&](Device d) {
      Tensor grad_weight = start.to(d).clone();
      backend(d).embedding_backward(grad.to(d), indices.to(d), grad_weight);
      return grad_weight.to_vector<double>();
    };
    const std::vector<double> cpu = gradient(kCpu);
    for (int run = 0; run < 3; ++run) {
      const std::vector<double> gpu = gradient(kCuda);
      REQUIRE(gpu.size() == cpu.size());
      size_t differing = 0;
      for (size_t i = 0; i < cpu.size(); ++i) differing += gpu[i] != cpu[i];
      INFO("run " << run);
      CHECK(differing == 0);
    }
  }
}

TEST_CASE("cuda: optimizer updates match the CPU", "[cuda]") {
  if (!cuda_ready()) return;
  Generator g(6);
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor p = random({1000}, dt, g), grad = random({1000}, dt, g);
    Tensor buf = random({1000}, dt, g), m = random({1000}, dt, g);
    Tensor v = random({1000}, dt, g, 0.1, 1);
    for (bool first : {true, false}) {
      compare_devices(
          "sgd_step", {p, grad, buf},
          [&](Device d, const std::vector<Tensor>& in) {
            Tensor param = in[0].clone(), momentum = in[2].clone();
            backend(d).sgd_step(param, in[1], momentum, 0.1, 0.9, 0.01, first);
            return std::vector<Tensor>{param, momentum};
          },
          tol_for(dt));
    }
    // Two parameters in one fused call, the second spanning several device chunks.
    Tensor p2 = random({9001}, dt, g), grad2 = random({9001}, dt, g);
    Tensor m2 = random({9001}, dt, g), v2 = random({9001}, dt, g, 0.1, 1);
    compare_devices(
        "adamw_step", {p, grad, m, v, p2, grad2, m2, v2},
        [&](Device d, const std::vector<Tensor>& in) {
          std::vector<Tensor> state;
          std::vector<AdamWSlot> slots;
          for (size_t k = 0; k < in.size(); k += 4) {
            slots.push_back({in[k].clone(), in[k + 1], in[k + 2].clone(), in[k + 3].clone()});
            state.insert(state.end(),
                         {slots.back().param, slots.back().exp_avg, slots.back().exp_avg_sq});
          }
          backend(d).adamw_step(slots, {0.01, 0.9, 0.999, 1e-8, 0.1, 3});
          return state;
        },
        tol_for(dt));
  }
}

TEST_CASE("cuda: five MLP training steps match the CPU", "[cuda]") {
  if (!cuda_ready()) return;
  Generator g(7);
  const std::vector<Tensor> init = {
      random({8, 32}, DType::f32, g, -0.5, 0.5), random({32}, DType::f32, g, -0.1, 0.1),
      random({32, 5}, DType::f32, g, -0.5, 0.5), random({5}, DType::f32, g, -0.1, 0.1)};
  Tensor x = random({64, 8}, DType::f32, g);
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < 64; ++i) labels.push_back(i % 5);
  const Tensor targets = from_vector<int64_t>(labels);
  auto train = [&](Device d) {
    const char* names[] = {"w1", "b1", "w2", "b2"};
    NamedParameters params;
    for (size_t i = 0; i < init.size(); ++i) {
      // A copy even on the CPU (where to() returns the tensor itself): AdamW updates in place,
      // and the CUDA run must start from the same weights.
      params.emplace_back(names[i], init[i].to(d).clone().requires_grad_());
    }
    AdamW adam(params, {0.01, 0.9, 0.999, 1e-8, 0.01});
    const Tensor xd = x.to(d), td = targets.to(d);
    std::vector<double> losses;
    for (int step = 0; step < 5; ++step) {
      for (auto& [name, p] : params) p.zero_grad();
      Tensor h = gelu(matmul(xd, params[0].second) + params[1].second);
      Tensor logits = matmul(h, params[2].second) + params[3].second;
      // log_softmax first (cross_entropy takes log-probabilities as well as logits) so that its
      // backward runs too.
      Tensor loss = cross_entropy(log_softmax(logits, 1), td);
      loss.backward();
      adam.step();
      losses.push_back(loss.item<double>());
    }
    std::vector<Tensor> final_params;
    for (auto& [name, p] : params) final_params.push_back(p.detach());
    return std::pair{losses, final_params};
  };
  auto [cpu_losses, cpu_params] = train(kCpu);
  auto [gpu_losses, gpu_params] = train(kCuda);
  for (size_t s = 0; s < cpu_losses.size(); ++s) {
    CHECK(gpu_losses[s] == Approx(cpu_losses[s]).epsilon(1e-5));
  }
  CHECK(cpu_losses.back() < cpu_losses.front());
  for (size_t i = 0; i < cpu_params.size(); ++i) {
    CHECK(gpu_params[i].device() == kCuda);
    check_close(gpu_params[i], cpu_params[i], 1e-4, "parameter " + std::to_string(i));
  }
}

#ifdef PIPIT_WITH_CUDA
TEST_CASE("cuda: the caching allocator reuses blocks and keeps exact stats", "[cuda]") {
  if (!cuda_ready()) return;
  cuda::empty_cache(0);
  const MemoryStats start = cuda::memory_stats(0);
  CHECK(start.reserved == 0);
  {
    Tensor a = Tensor::empty({1000}, DType::f32, kCuda);  // 4000 bytes: one 4096-byte class
    CHECK(cuda::memory_stats(0).allocated == start.allocated + 4096);
  }
  CHECK(cuda::memory_stats(0).allocated == start.allocated);
  CHECK(cuda::memory_stats(0).reserved == 4096);
  cuda::reset_peak_memory(0);
  // One step's blocks: 1 MiB (its own class), 24000 bytes (rounded to 24064) and 4000 bytes.
  const size_t step_bytes = (size_t{1} << 20) + 24064 + 4096;
  for (int step = 0; step < 1000; ++step) {
    {
      Tensor a = Tensor::empty({256, 1024}, DType::f32, kCuda);
      Tensor b = Tensor::empty({3000}, DType::f64, kCuda);
      Tensor c = Tensor::empty({1000}, DType::f32, kCuda);
      backend(kCuda).fill(a, 1.0);
      REQUIRE(cuda::memory_stats(0).allocated == start.allocated + step_bytes);
    }
    REQUIRE(cuda::memory_stats(0).reserved == step_bytes);
  }
  const MemoryStats end = cuda::memory_stats(0);
  CHECK(end.allocated == start.allocated);
  CHECK(end.peak_allocated == start.allocated + step_bytes);
  cuda::empty_cache(0);
  CHECK(cuda::memory_stats(0).reserved == 0);
}
#endif

TEST_CASE("cuda: index checks wait for no read-back and raise the first bad index in order",
          "[cuda]") {
  if (!cuda_ready()) return;
  const Tensor weight = reshape(arange(0, 12, 1, {DType::f32}), {4, 3}).to(kCuda);
  Tensor first = Tensor::empty({2, 3}, DType::f32, kCuda);
  Tensor second = Tensor::empty({1, 3}, DType::f32, kCuda);
  Tensor clean = Tensor::empty({2, 3}, DType::f32, kCuda);
  backend(kCuda).embedding(weight, from_vector<int64_t>({1, 2}).to(kCuda), clean);
  backend(kCuda).embedding(weight, from_vector<int64_t>({0, -2}).to(kCuda), first);
  backend(kCuda).embedding(weight, from_vector<int64_t>({9}).to(kCuda), second);
  // Two bad checks queued: the first one queued is raised, and both are then forgotten.
  CHECK_THROWS_WITH(
      synchronize(kCuda),
      Catch::Contains("embedding: index -2 at position 1 is out of range for 4 rows"));
  CHECK(second.to(kCpu).to_vector<float>() == std::vector<float>{0, 0, 0});
  // An embedding's gradient skips bad rows instead of writing outside the weight.
  Tensor grad_weight = zeros({4, 3}, {DType::f32, kCuda});
  backend(kCuda).embedding_backward(ones({2, 3}, {DType::f32, kCuda}),
                                    from_vector<int64_t>({3, 7}).to(kCuda), grad_weight);
  CHECK(grad_weight.to(kCpu).to_vector<float>() ==
        std::vector<float>{0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1});
}
