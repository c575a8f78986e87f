// pipit's half of bench/gpu_gemm.py: square GEMMs on cuda:0 through Backend::matmul into a
// preallocated output, so the time is cuBLAS plus pipit's dispatch and nothing of autograd.
// Prints one JSON line per (dtype, size): {"dtype", "size", "iters", "ms": [ms per GEMM]}.
// dtypes: f32 (full precision), tf32 (set_float32_matmul_precision("high")), bf16 (bf16 in
// and out), bf16-f32 (bf16 in, f32 out: the GEMM autocast runs).
//
// usage: gpu_gemm [--dtypes f32,tf32,bf16,bf16-f32] [--sizes 1024,2048,4096,8192]
//                 [--warmup 3] [--repeats 10]
#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>

#include "bench/gpu_bench.h"
#include "pipit.h"
#include "support/flags.h"
#include "tensor/precision.h"
#include "tensor/stream.h"

using namespace pipit;

namespace {

// GEMMs per timed repeat: one 8192^3 GEMM's worth of work, so small sizes are not timed at
// the resolution of a kernel launch.
int64_t iterations(int64_t n) {
  return std::clamp<int64_t>(int64_t{8192} * 8192 * 8192 / (n * n * n), 1, 512);
}

std::vector<double> time_gemm(const std::string& kind, int64_t n, int64_t iters, int64_t warmup,
                              int64_t repeats) {
  const Device device = Device::cuda(0);
  set_float32_matmul_precision(kind == "tf32" ? "high" : "highest");
  const DType in = kind.starts_with("bf16") ? DType::bf16 : DType::f32;
  const DType out_dtype = kind == "bf16" ? DType::bf16 : DType::f32;
  Generator generator(0);
  const Tensor a = randn({n, n}, &generator, {DType::f32, device}).to(in);
  const Tensor b = randn({n, n}, &generator, {DType::f32, device}).to(in);
  const Tensor out = empty({n, n}, {out_dtype, device});
  Backend& kernels = backend(device);
  auto times = bench::time_ms(warmup, repeats, [&] {
    for (int64_t i = 0; i < iters; ++i) kernels.matmul(a, b, out, false);
    synchronize(device);
  });
  for (double& t : times) t /= static_cast<double>(iters);
  return times;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    support::Flags flags("gpu_gemm", "Square GEMMs on one GPU, per dtype and size.");
    flags.add("dtypes", "f32,tf32,bf16,bf16-f32", "kinds of product to time");
    flags.add("sizes", "1024,2048,4096,8192", "matrix sizes");
    bench::add_timing_flags(flags, "products");
    flags.parse(argc, argv);
    const auto kinds = flags.choices("dtypes", {"f32", "tf32", "bf16", "bf16-f32"});
    const auto sizes = flags.integers("sizes");
    const auto [warmup, repeats] = bench::timing(flags);
    if (!bench::has_cuda_device("gpu_gemm")) return 0;
    for (const auto& kind : kinds) {
      for (const auto& size : sizes) {
        const int64_t n = size, iters = iterations(n);
        const nlohmann::json row = {{"dtype", kind},
                                    {"size", n},
                                    {"iters", iters},
                                    {"ms", time_gemm(kind, n, iters, warmup, repeats)}};
        bench::print_row(row);
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_gemm: %s\n", e.what());
    return 1;
  }
}
