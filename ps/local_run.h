#pragma once
// Runs a parameter-server training inside this process: config.servers shard threads and
// config.workers worker threads, talking through a LocalHub. Each worker gets a replica of
// the model (rebuilt from its config()) and its batches from `batch`.
#include <functional>
#include <utility>
#include <vector>

#include "nn/module.h"
#include "ps/parameter_server.h"
#include "ps/ps_worker.h"

namespace pipit {

struct PsLocalOptions {
  int64_t steps = 100;  // per worker
  // Worker w's batch for its step `step`: (input, target).
  std::function<std::pair<Tensor, Tensor>(int worker, int64_t step)> batch;
  std::vector<double> slowdown = {};  // per worker (>= 1); empty: none slowed
  // After every worker step, on that worker's thread (calls are serialized).
  std::function<void(int worker, int64_t step, double loss)> on_step;
};

struct PsRunReport {
  StateDict weights;  // the final parameters of every shard
  std::vector<PsServerStats> servers;
  std::vector<PsWorkerStats> workers;
  std::vector<std::vector<double>> losses;  // [worker][step]
  double seconds = 0;
};

// The first error of any thread is rethrown once every thread has stopped.
PsRunReport train_ps_locally(const Module& model, const PsConfig& config,
                             const PsLocalOptions& options);

}  // namespace pipit
