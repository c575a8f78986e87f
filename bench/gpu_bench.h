#pragma once
// What the gpu_* benchmarks share: the CUDA device check (a machine without a GPU is not an
// error: the benchmark says so and exits 0), timing, with the per-kernel benchmarks' timing
// flags (gpu_common.py's --warmup and --repeats, which it passes on), and printing a result.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/flags.h"
#include "tensor/cuda/cuda_device.h"
#include "tensor/error.h"

namespace pipit::bench {

// False, after saying why, when there is no CUDA device to run on.
inline bool has_cuda_device(const char* program) {
  if (cuda::device_count() > 0) return true;
  std::printf("%s: needs a CUDA device; none found\n", program);
  return false;
}

// --warmup and --repeats, counting `calls` (what one timed run is: calls, products).
inline void add_timing_flags(support::Flags& flags, const std::string& calls = "calls") {
  flags.add("warmup", "3", "untimed " + calls + " first");
  flags.add("repeats", "10", "timed " + calls);
}

struct Timing {
  int64_t warmup = 0, repeats = 0;
};

inline Timing timing(const support::Flags& flags) {
  return {flags.integer("warmup", 0), flags.integer("repeats")};
}

// Milliseconds per call of `run` (which must end with a device synchronise), over `repeats`
// timed calls after `warmup` untimed ones.
template <typename Run>
std::vector<double> time_ms(int64_t warmup, int64_t repeats, Run run) {
  using Clock = std::chrono::steady_clock;
  for (int64_t i = 0; i < warmup; ++i) run();
  std::vector<double> times;
  for (int64_t i = 0; i < repeats; ++i) {
    const auto start = Clock::now();
    run();
    times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  return times;
}

// A result as one JSON line, flushed at once: gpu_common.py reads the lines as they come.
inline void print_row(const nlohmann::json& row) {
  std::printf("%s\n", row.dump().c_str());
  std::fflush(stdout);
}

}  // namespace pipit::bench
