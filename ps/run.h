#pragma once
// What a parameter-server training run is given and what it reports, whether its shards and
// workers are threads of one process (local_run.h) or MPI ranks (mpi/mpi_ps.h).
#include <functional>
#include <utility>
#include <vector>

#include "ps/parameter_server.h"
#include "ps/worker.h"

namespace pipit {

struct PsRunOptions {
  int64_t steps = 100;  // per worker
  // Worker w's batch for its step `step`: (input, target).
  std::function<std::pair<Tensor, Tensor>(int worker, int64_t step)> batch;
  std::vector<double> slowdown = {};  // per worker (>= 1); empty: none slowed
  // After every worker step, on that worker's thread (calls are serialized).
  std::function<void(int worker, int64_t step, double loss)> on_step;
  // Each shard before it serves (to load a checkpoint, or set after_update) and once every
  // worker has left (to save one), on that shard's thread.
  std::function<void(ParameterServer& server)> on_server_start;
  std::function<void(const ParameterServer& server)> on_server_end;
};

struct PsRunReport {
  StateDict weights;  // the final parameters of every shard
  std::vector<PsServerStats> servers;
  std::vector<PsWorkerStats> workers;
  std::vector<std::vector<double>> losses;  // [worker][step]
  double seconds = 0;
};

}  // namespace pipit
