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
#include "support/worker_process.h"

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

// A pipeline times data parallelism: its schedule, p stages, r replicas, v chunks per stage.
struct ReplicaLayout {
  std::string schedule;
  int p, r, v;
  bool shard_optimizer = false;
};

// p, r, v and the schedule of `layout`, m microbatches per replica, AdamW.
inline PipelineConfig replica_config(const ReplicaLayout& layout, int microbatches) {
  PipelineConfig config;
  config.stages = layout.p;
  config.replicas = layout.r;
  config.microbatches = microbatches;
  config.chunks_per_stage = layout.v;
  config.schedule = layout.schedule;
  config.shard_optimizer = layout.shard_optimizer;
  config.optimizer = kAdamW;
  return config;
}

using support::endpoints;
using support::logs;
using support::start_workers;
using support::WorkerProcess;
using support::Workers;

// How the tests start a worker: this executable in its --worker role (tests/main.cpp), calling a
// silent peer lost after 3 s so that fault tests end soon.
inline support::WorkerLaunch test_worker(const std::string& token = "",
                                         std::vector<std::string> flags = {}) {
  flags.insert(flags.begin(), {"--peer-timeout-ms", "3000"});
  return {.flags = std::move(flags), .token = token};
}

}  // namespace pipit::testing
