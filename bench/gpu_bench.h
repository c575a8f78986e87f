#pragma once
// What the gpu_* benchmarks share: `--name value` flags with defaults, the CUDA device check
// (a machine without a GPU is not an error: the benchmark says so and exits 0), and timing.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "tensor/cuda/cuda_device.h"
#include "tensor/error.h"

namespace pipit::bench {

class Flags {
 public:
  // `switches` take no value; every other flag takes one.
  Flags(int argc, char** argv, const std::vector<std::string>& switches) {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      PIPIT_CHECK(arg.starts_with("--"), "expected a --flag, got '", arg, "'");
      const std::string name = arg.substr(2);
      if (std::find(switches.begin(), switches.end(), name) != switches.end()) {
        values_.insert_or_assign(name, std::string("1"));
      } else {
        PIPIT_CHECK(i + 1 < argc, "flag ", arg, " needs a value");
        values_.insert_or_assign(name, std::string(argv[++i]));
      }
    }
  }
  // Each flag is read once; finish() then rejects the ones nobody read.
  std::string take(const std::string& name, const std::string& fallback) {
    auto it = values_.find(name);
    if (it == values_.end()) return fallback;
    std::string value = it->second;
    values_.erase(it);
    return value;
  }
  int64_t take_int(const std::string& name, int64_t fallback) {
    return std::stoll(take(name, std::to_string(fallback)));
  }
  bool take_switch(const std::string& name) { return take(name, "") == "1"; }
  void finish() const { PIPIT_CHECK(values_.empty(), "unknown flag --", values_.begin()->first); }

 private:
  std::map<std::string, std::string> values_;
};

inline std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> items;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t end = std::min(list.find(',', start), list.size());
    if (end > start) items.push_back(list.substr(start, end - start));
    start = end + 1;
  }
  return items;
}

// False, after saying why, when there is no CUDA device to run on.
inline bool has_cuda_device(const char* program) {
  if (cuda::device_count() > 0) return true;
  std::printf("%s: needs a CUDA device; none found\n", program);
  return false;
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

}  // namespace pipit::bench
