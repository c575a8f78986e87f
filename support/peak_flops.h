#pragma once
// The machine's FP32 peak on one core, measured rather than taken from a datasheet: a loop of
// independent fused multiply-adds on the widest vectors the CPU has (AVX-512 or AVX2), with
// enough accumulators to cover the FMA latency on every pipe.
#include <chrono>
#include <string>

namespace pipit::support {

namespace detail {

typedef float Vec16 __attribute__((vector_size(64)));
typedef float Vec8 __attribute__((vector_size(32)));

template <typename Vec>
struct PeakLoop {
  static constexpr int kLanes = sizeof(Vec) / sizeof(float);
  static constexpr int kAccumulators = 12;
  // FLOPs done: 2 per lane per FMA.
  __attribute__((always_inline)) static double run(long iterations, float* sink) {
    Vec acc[kAccumulators];
    for (int i = 0; i < kAccumulators; ++i) acc[i] = Vec{} + static_cast<float>(i) * 1e-3f;
    const Vec a = Vec{} + 0.999999f, b = Vec{} + 1e-7f;
    for (long it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
      for (int i = 0; i < kAccumulators; ++i) acc[i] = acc[i] * a + b;
    }
    float total = 0;
    for (int i = 0; i < kAccumulators; ++i) total += acc[i][0];
    *sink = total;
    return 2.0 * kLanes * kAccumulators * static_cast<double>(iterations);
  }
};

__attribute__((target("avx512f"))) inline double peak_avx512(long iterations, float* sink) {
  return PeakLoop<Vec16>::run(iterations, sink);
}
__attribute__((target("avx2,fma"))) inline double peak_avx2(long iterations, float* sink) {
  return PeakLoop<Vec8>::run(iterations, sink);
}

}  // namespace detail

struct Peak {
  double gflops = 0;
  std::string isa;
};

// The best of a few 50 ms runs, on the calling thread.
inline Peak measure_peak_gflops() {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f");
  Peak peak{0, avx512 ? "AVX-512" : "AVX2"};
  float sink = 0;
  constexpr long kIterations = 4'000'000;
  for (int round = 0; round < 5; ++round) {
    const auto start = std::chrono::steady_clock::now();
    const double flops =
        avx512 ? detail::peak_avx512(kIterations, &sink) : detail::peak_avx2(kIterations, &sink);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (sink != sink) return peak;  // keeps the loop's result alive
    peak.gflops = std::max(peak.gflops, flops / s / 1e9);
  }
  return peak;
}

}  // namespace pipit::support
