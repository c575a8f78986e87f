#pragma once
// Runs a parameter-server training inside this process: config.servers shard threads and
// config.workers worker threads, talking through a LocalHub. Each worker gets a replica of
// the model (rebuilt from its config()) and its batches from `batch`.
#include "nn/module.h"
#include "ps/run.h"

namespace pipit {

// The first error of any thread is rethrown once every thread has stopped.
PsRunReport train_ps_locally(const Module& model, const PsConfig& config,
                             const PsRunOptions& options);

}  // namespace pipit
