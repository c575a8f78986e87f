#pragma once
// PsConfig: how a parameter-server run trains. Endpoints: server shard s is communicator id
// s, worker w is id servers + w.
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

namespace pipit {

struct PsConfig {
  // "sync": each update averages one gradient from every worker, in worker order.
  // "async": AsySG-InCon; an update after every `accumulate` gradients from any workers.
  // "bounded": as async, but no worker computes more than max_staleness steps ahead of the
  // slowest live worker (stale synchronous parallel, ps/staleness_gate.h), over any number
  // of shards.
  std::string mode = "sync";
  int servers = 1;  // shards: parameters split over them by whole tensors, balanced by bytes
  int workers = 1;
  int accumulate = 1;     // async and bounded: gradients per update
  int max_staleness = 4;  // bounded: steps ahead of the slowest worker
  // sync: while at least this many workers live, an update goes on without a lost worker
  // (its share of the average rescaled to the live ones); 0: every worker must live.
  int min_workers = 0;
  bool compress = false;  // push gradients as bf16 with error feedback
  // Push each shard's gradients as soon as the backward has made them final, while it goes
  // on with the layers below; false: push after the backward.
  bool overlap = true;
  nlohmann::json optimizer = {{"type", "SGD"}, {"lr", 0.01}};
  nlohmann::json loss = {{"type", "CrossEntropyLoss"}};
  // The longest any side waits for a message before failing with an error naming the wait.
  std::chrono::milliseconds timeout{60000};

  // Each worker scales its loss gradient by 1 / gradient_group(): the number of gradients
  // summed into one update (workers in sync mode, accumulate otherwise).
  int gradient_group() const { return mode == "sync" ? workers : accumulate; }
  int server_id(int shard) const { return shard; }
  int worker_id(int worker) const { return servers + worker; }
};

// Throws an Error naming the first invalid field.
void validate(const PsConfig& config);

// As JSON (every field; the timeout as "timeout_ms") and back: the reader refuses unknown
// fields, missing or mistyped ones with a ControlError naming `what` and the field, then
// validates.
nlohmann::json to_json(const PsConfig& config);
PsConfig ps_config_from_json(const nlohmann::json& json, const std::string& what);

}  // namespace pipit
