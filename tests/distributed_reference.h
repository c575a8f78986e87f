#pragma once
// What the multi-process pipeline tests share: a small GPT and its batch, the pipeline
// configs they compare, worker addresses and logs, and bitwise comparison.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bitwise.h"
#include "nn/builders.h"
#include "pipeline/pipeline.h"
#include "pipeline_models.h"
#include "pipit.h"
#include "worker_process.h"

namespace pipit::testing {

inline std::shared_ptr<Sequential> small_gpt(int64_t layers = 6) {
  Generator generator(5);
  return gpt({11, 6, layers, 2, 16, 0.0}, &generator);
}

inline PipelineConfig config_for(const std::string& schedule, int v,
                                 const std::string& recompute = "none") {
  PipelineConfig config;
  config.stages = 4;
  config.microbatches = 4;
  config.chunks_per_stage = v;
  config.schedule = schedule;
  config.recompute = recompute;
  config.optimizer = {{"type", "AdamW"}, {"lr", 0.01}};
  config.timeout = std::chrono::milliseconds(20000);
  return config;
}

inline std::string logs(const std::vector<std::unique_ptr<WorkerProcess>>& workers) {
  std::string out;
  for (size_t i = 0; i < workers.size(); ++i) {
    out += "--- worker " + std::to_string(i) + " log:\n" + workers[i]->log();
  }
  return out;
}

inline std::vector<std::string> endpoints(
    const std::vector<std::unique_ptr<WorkerProcess>>& workers) {
  std::vector<std::string> out;
  for (const auto& w : workers) out.push_back(w->endpoint());
  return out;
}

}  // namespace pipit::testing
