#pragma once
// What a parameter-server training run is given and what it reports, wherever its shards and
// workers run (ps/launch.h: threads of this process, MPI ranks, pipit-worker hosts), and the
// parts of a run every launch shares: a shard's checkpoints, a worker's loop.
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "ps/parameter_server.h"
#include "ps/worker.h"

namespace pipit {

struct PsRunOptions {
  int64_t steps = 100;  // per worker
  // Worker w's batch for its step `step`: (input, target). On pipit-worker hosts each worker is
  // shipped its batches of every step, drawn here before the run.
  std::function<std::pair<Tensor, Tensor>(int worker, int64_t step)> batch;
  std::vector<double> slowdown = {};  // per worker (>= 1); empty: none slowed
  // After every worker step, where the worker runs: on its thread here (calls are
  // serialized), on its rank under MPI; never for workers on pipit-worker hosts.
  std::function<void(int worker, int64_t step, double loss)> on_step;
  // Checkpoints (ps/checkpoint.h): each shard saves its weights, optimizer state and version
  // to checkpoint_dir every checkpoint_every updates (0: only at the end) and when the run
  // ends; with `resume` it first loads its file (in sync mode, of the newest version every
  // shard saved), and the workers start at the step the shards' versions say the run had
  // reached. Each shard reads and writes the directory where it runs: on other ranks or
  // hosts, give one every node sees (sync shards read each other's files to agree).
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  bool resume = false;
};

struct PsRunReport {
  // The step every worker began at: 0, or where a resumed run's checkpoints were.
  int64_t first_step = 0;
  StateDict weights;          // the final parameters of every shard (under MPI: this rank's)
  StateDict optimizer_state;  // and their optimizer state ("step" is shard 0's)
  std::vector<PsServerStats> servers;       // per shard (from pipit-worker hosts: the version only)
  std::vector<PsWorkerStats> workers;       // per worker (not from pipit-worker hosts)
  std::vector<std::vector<double>> losses;  // [worker][step] (not from pipit-worker hosts)
  double seconds = 0;
};

// A shard about to serve: loads its checkpoint when options.resume says so, and saves one
// every options.checkpoint_every updates. `model_config` (the whole model's) goes into each
// checkpoint. Nothing without options.checkpoint_dir.
void start_shard(ParameterServer& server, const PsRunOptions& options,
                 const nlohmann::json& model_config);
// A shard that has served: its final checkpoint.
void end_shard(const ParameterServer& server, const PsRunOptions& options,
               const nlohmann::json& model_config);

// The step a run resumed from shard 0's `version` begins at: sync updates once per step; async
// and bounded once per `accumulate` gradients of any worker, so a worker's step is the updates
// times accumulate over the workers.
int64_t first_step(const PsConfig& config, int64_t version);

// A worker's run: join, its steps from the first (0, or when resuming, where the shards'
// versions say the run was) to `steps`, leave. Returns its losses; on_step after each step.
std::vector<double> run_ps_worker(PsWorker& worker, const PsConfig& config, int64_t steps,
                                  bool resume,
                                  const std::function<std::pair<Tensor, Tensor>(int64_t)>& batch,
                                  const std::function<void(int64_t step, double loss)>& on_step);

}  // namespace pipit
