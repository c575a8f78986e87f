#pragma once
// A parameter-server role for a bare pipit-worker: what a launcher (ps/launch.h) sends so the
// worker can serve one shard or be one data-parallel worker. A shard gets its parameters; a
// worker gets the shards' addresses and its own data shard, from which step i takes rows
// [i * batch, (i + 1) * batch) modulo its rows; both get the model's config and where the run
// keeps its checkpoints.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/message.h"
#include "ps/config.h"
#include "tensor/state_dict.h"

namespace pipit {

struct PsPackage {
  std::string role;  // "shard" or "worker"
  int index = 0;
  PsConfig config;
  int sharing = 1;  // roles of this run on this role's host, this one included
  nlohmann::json model = nlohmann::json::object();  // Module::config() of the whole model
  // The run's checkpoints (PsRunOptions): the shard saves and resumes, the worker resumes.
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  bool resume = false;
  // shard
  StateDict weights;
  // worker
  std::vector<std::string> shards;  // "host:port" of every shard, in shard order
  Tensor inputs, targets;           // this worker's data: rows along dim 0
  int64_t batch = 1, steps = 0;
  double slowdown = 1.0;
};

Message to_message(const PsPackage& package);
// Every field checked; errors are ControlErrors naming the field.
PsPackage read_ps_package(const Message& message);

// The rows of worker data for `step`: [step * batch, (step + 1) * batch) modulo the rows.
std::pair<Tensor, Tensor> ps_batch(const PsPackage& package, int64_t step);

}  // namespace pipit
