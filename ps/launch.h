#pragma once
// Runs a parameter-server training on bare pipit-worker processes: the first config.servers
// addresses serve the shards, the next config.workers the workers. The launcher claims every
// worker (a fresh session per run, as DistributedPipeline does), sends each shard its
// parameters and each worker the model's config and its data shard, waits until every shard
// is Ready before starting the workers, and collects every shard's final weights and
// optimizer state. Any role's error, lost connection or silence beyond config.timeout ends
// the run with an Error naming the role and address, after telling the others to stop.
#include <string>
#include <vector>

#include "comm/tcp_communicator.h"
#include "nn/module.h"
#include "ps/config.h"

namespace pipit {

struct PsWorkerData {
  Tensor inputs, targets;  // rows along dim 0; step i trains on rows [i * batch, (i+1) * batch)
};

struct PsLaunchResult {
  StateDict weights;          // every shard's final parameters
  StateDict optimizer_state;  // every shard's final optimizer state ("step" is shard 0's)
  int64_t version = 0;        // shard 0's updates
};

PsLaunchResult train_ps_on_workers(const Module& model, const PsConfig& config,
                                   const std::vector<PsWorkerData>& data, int64_t batch,
                                   int64_t steps, const std::vector<std::string>& addresses,
                                   TcpOptions tcp = {});

}  // namespace pipit
