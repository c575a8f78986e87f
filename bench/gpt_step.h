#pragma once
// The GPT step that bench/tcp_throughput times in one process, over worker processes (TCP)
// and over MPI ranks: one model, batch and pipeline config for all three, so their step
// times compare.
#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "nn/builders.h"
#include "pipeline/coordinator.h"
#include "pipit.h"

namespace pipit::bench {

struct GptStep {
  Tensor x, y;
  PipelineConfig config;
  std::shared_ptr<Sequential> model;
};

inline GptStep gpt_step_setup() {
  GptStep s;
  std::vector<int64_t> tokens(16 * 64), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int64_t>((i * 7) % 65);
    targets[i] = static_cast<int64_t>((i * 7 + 3) % 65);
  }
  s.x = from_vector(tokens, {16, 64});
  s.y = from_vector(targets, {16, 64});
  s.config.stages = 4;
  s.config.microbatches = 8;
  s.config.schedule = "1f1b";
  s.config.optimizer = {{"type", "AdamW"}, {"lr", 1e-3}};
  Generator generator(0);
  s.model = gpt({65, 64, 4, 4, 128, 0.0}, &generator);
  return s;
}

inline const char* gpt_step_description() {
  return "GPT (vocab 65, context 64, 4 layers, width 128), batch 16, 1F1B, p = 4, m = 8, "
         "1 thread per stage";
}

// Steps before the timed ones: a fresh worker process's allocator and page tables fill
// over its first steps, which is start-up, not the steady step time compared here.
constexpr int kWarmUpSteps = 5;

// Median ms of `steps` train steps after kWarmUpSteps.
inline double median_step_ms(Coordinator& coordinator, const GptStep& s, int steps) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < kWarmUpSteps; ++i) coordinator.train_step(s.x, s.y);
  std::vector<double> ms;
  for (int i = 0; i < steps; ++i) {
    const auto start = Clock::now();
    coordinator.train_step(s.x, s.y);
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace pipit::bench
