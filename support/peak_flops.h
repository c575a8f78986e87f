#pragma once
// The machine's FP32 peak on one core, measured rather than taken from a datasheet: a loop of
// independent fused multiply-adds on the widest vectors the CPU has (AVX-512 or AVX2), with
// enough accumulators to cover the FMA latency on every pipe.
#include <immintrin.h>

#include <algorithm>
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

// bf16 dot products (vdpbf16ps): 2 multiply-adds per f32 lane per instruction.
__attribute__((target("avx512f,avx512bf16"))) inline double peak_bf16(long iterations,
                                                                      float* sink) {
  constexpr int kAccumulators = 12;
  __m512 acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-4f), _mm512_set1_ps(1e-4f));
  for (long it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  float total = 0;
  for (int i = 0; i < kAccumulators; ++i) total += _mm512_cvtss_f32(acc[i]);
  *sink = total;
  return 2.0 * 32 * kAccumulators * static_cast<double>(iterations);
}

}  // namespace detail

struct Peak {
  double gflops = 0;
  std::string isa;
};

// The best of a few 50 ms runs of `loop`, on the calling thread.
template <typename Loop>
double best_gflops(Loop loop) {
  float sink = 0;
  double best = 0;
  constexpr long kIterations = 4'000'000;
  for (int round = 0; round < 5; ++round) {
    const auto start = std::chrono::steady_clock::now();
    const double flops = loop(kIterations, &sink);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (sink != sink) return best;  // keeps the loop's result alive
    best = std::max(best, flops / s / 1e9);
  }
  return best;
}

// The FP32 peak of one core.
inline Peak measure_peak_gflops() {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f");
  Peak peak{0, avx512 ? "AVX-512" : "AVX2"};
  peak.gflops = avx512 ? best_gflops(detail::peak_avx512) : best_gflops(detail::peak_avx2);
  return peak;
}

// The bf16 dot-product peak of one core (AVX512_BF16), gflops 0 on a CPU without it.
inline Peak measure_bf16_peak_gflops() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512bf16")) return {0, "none"};
  return {best_gflops(detail::peak_bf16), "AVX512_BF16"};
}

}  // namespace pipit::support
