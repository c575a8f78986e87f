#pragma once
// PsWorker: one data-parallel worker of a parameter-server run (parameter_server.h): a full
// model replica that trains on its own batches. join() reads the parameters from every
// shard; each step() computes the loss gradient on one batch (scaled by 1 / the number of
// gradients an update sums), pushes each shard its part, and waits for the parameters that
// shard sends back, loading each shard's as it comes. With config.overlap the push leaves in
// parts, each as soon as the backward has made its gradients final (ready_gradients.h), while
// the backward goes on with the layers below. Errors name the shard: a refused push, a lost
// server, a wait longer than config.timeout.
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "loss/loss.h"
#include "nn/module.h"
#include "ps/config.h"
#include "ps/gradient_compression.h"
#include "ps/ready_gradients.h"

namespace pipit {

struct PsWorkerStats {
  int64_t steps = 0;
  int64_t pushed_bytes = 0;        // tensor bytes sent in pushes
  int64_t uncompressed_bytes = 0;  // what they would have been without compression
  double compute_ms = 0;           // forward and backward
  double push_ms = 0;              // handing pushes to the communicator
  double wait_ms = 0;              // after the backward, until every shard's parameters are in
};

class PsWorker {
 public:
  // slowdown >= 1 stretches each step's forward and backward to that many times their
  // duration, as on a slower machine (tests and benchmarks).
  PsWorker(std::shared_ptr<Communicator> comm, std::shared_ptr<Module> model, PsConfig config,
           int index, double slowdown = 1.0);

  void join();
  // One iteration on (input, target); returns the batch's loss before the update.
  double step(const Tensor& input, const Tensor& target);
  // Tells every shard this worker is done.
  void leave();

  Module& model() { return *model_; }
  // Per shard, the version of the parameters the model holds now.
  const std::vector<int64_t>& versions() const { return versions_; }
  const PsWorkerStats& stats() const { return stats_; }

 private:
  void receive_parameters(std::vector<bool> pending);
  void push(const PushPart& part, const StateDict& parameters);
  // Sleeps so that the step's computation so far took `slowdown` times as long.
  void stretch();

  std::shared_ptr<Communicator> comm_;
  std::shared_ptr<Module> model_;
  PsConfig config_;
  int index_;
  double slowdown_;
  std::unique_ptr<Loss> loss_;
  std::vector<int64_t> versions_;
  std::vector<std::vector<std::string>> shard_names_;  // learned from each shard's parameters
  GradientCompressor compressor_;
  std::unique_ptr<ReadyGradients> ready_;  // with config.overlap
  std::chrono::steady_clock::time_point step_start_;
  double pushing_ms_ = 0, slept_ms_ = 0;  // of this step
  PsWorkerStats stats_;
};

}  // namespace pipit
